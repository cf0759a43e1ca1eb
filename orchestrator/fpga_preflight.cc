#include "orchestrator/fpga_preflight.h"

#include "common/error.h"

namespace msaflow::orchestrator {

kernels::fpga::Config FpgaFor(const workflow::Pipeline& p, const ModuleSpec& mod) {
  kernels::fpga::Config c = mod.fpga;
  if (!p.fpga.empty()) c.backend = p.fpga;
  return c;
}

void FpgaPreflight(const workflow::Pipeline& p, const Machine& m) {
  if (!m.OnThisHost()) return;
  for (const char* step : {"prepare", "select"}) {
    const ModuleSpec& mod = m.Module(p.steps.at(step).module, "/steps/" + std::string(step) + "/module");
    const kernels::fpga::Config c = FpgaFor(p, mod);
    if (c.backend != "opencl") continue;
    const std::string missing = kernels::fpga::OpenClMissing(c);
    if (!missing.empty())
      Throw(ErrorKind::kUnsupported, "pipeline " + p.name + ": step " + step + " on module " + mod.name +
                                         " asks for fpga \"opencl\" (" + (p.fpga.empty() ? "machine " + m.name : "the pipeline's /fpga") +
                                         "), but " + missing);
  }
}

}  // namespace msaflow::orchestrator
