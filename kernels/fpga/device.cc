#include "kernels/fpga/device.h"

#include "common/error.h"

namespace msaflow::kernels::fpga {

std::unique_ptr<Device> Open(const Config& config, std::string* notice) {
  if (config.backend == "cpu") return OpenCpu();
  if (config.backend == "opencl") return OpenOpenCl(config);
  if (config.backend != "auto")
    Throw(ErrorKind::kInvalidInput, "fpga: backend \"" + config.backend + "\" is not one of cpu, opencl, auto");
  // Only a missing platform or device falls back; an OpenCL that is there but fails (a kernel
  // that does not build, a bad board binary) is an error, not a silent change of device.
  const std::string why = OpenClMissing(config);
  if (why.empty()) return OpenOpenCl(config);
  if (notice) *notice = "fpga auto: no OpenCL device, so the CPU backend (" + why.substr(why.find(": ") + 2) + ")";
  return OpenCpu();
}

}  // namespace msaflow::kernels::fpga
