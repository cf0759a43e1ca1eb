#include "orchestrator/fpga_preflight.h"

#include "common/error.h"

namespace msaflow::orchestrator {

kernels::fpga::Config FpgaFor(const workflow::Pipeline& p, const ModuleSpec& mod) {
  kernels::fpga::Config c = mod.fpga;
  if (p.fpga) c.backend = *p.fpga;
  return c;
}

void FpgaPreflight(const workflow::Pipeline& p, const Machine& m) {
  if (!m.OnThisHost()) return;
  for (const auto& [step_kind, s] : p.steps) {
    if (!workflow::UsesFpga(step_kind)) continue;
    const std::string step = workflow::StepName(step_kind);
    const ModuleSpec& mod = m.Module(s.module, "/steps/" + step + "/module");
    const kernels::fpga::Config c = FpgaFor(p, mod);
    if (c.backend != kernels::fpga::Backend::kOpenCl) continue;
    const std::string missing = kernels::fpga::OpenClMissing(c);
    if (!missing.empty())
      Throw(ErrorKind::kUnsupported, "pipeline " + p.name + ": step " + step + " on module " + mod.name +
                                         " asks for fpga \"opencl\" (" + (!p.fpga ? "machine " + m.name : "the pipeline's /fpga") +
                                         "), but " + missing);
  }
}

}  // namespace msaflow::orchestrator
