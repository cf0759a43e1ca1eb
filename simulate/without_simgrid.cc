// `msaflow simulate` and `--ranks auto` in a build without SimGrid (meson option `simulate`,
// auto: on where libsimgrid-dev is found): each says what it needs, in one line.
#include "common/error.h"
#include "simulate/simulate.h"

namespace msaflow::simulate {

bool HaveSimGrid() { return false; }

void RequireSimGrid(const std::string& what) {
  Throw(ErrorKind::kUnsupported,
        what +
            " needs SimGrid, and this msaflow was built without it: apt-get install libsimgrid-dev, then "
            "meson setup --reconfigure BUILD_DIR and ninja -C BUILD_DIR (scripts/test.sh installs it)");
}

Result Simulate(const workflow::Pipeline&, const workflow::Machine&, const Calibration&, const Options&) {
  RequireSimGrid("msaflow simulate");
  return {};
}

nlohmann::json FavouredRanks(const workflow::Pipeline&, const workflow::Machine&, const Calibration&, const Options&) {
  RequireSimGrid("--ranks auto (the simulator's model of the earlier runs)");
  return {};
}

}  // namespace msaflow::simulate
