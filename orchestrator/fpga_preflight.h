// Before a run on this machine starts: can the FPGA steps (prepare, select) have the backend
// they ask for? A step that asks for "opencl" where no OpenCL device is present is refused here
// (kUnsupported, exit 6), before anything is written; "auto" falls back in the step itself,
// with a notice. Under Slurm the FPGA is on the module's nodes, not here: the steps find it there.
#pragma once

#include "workflow/machine.h"
#include "workflow/pipeline.h"

namespace msaflow::orchestrator {

using workflow::Machine;
using workflow::ModuleSpec;

// The FPGA settings a step gets: its module's, with the pipeline's backend override.
kernels::fpga::Config FpgaFor(const workflow::Pipeline& p, const ModuleSpec& mod);

void FpgaPreflight(const workflow::Pipeline& p, const Machine& m);

}  // namespace msaflow::orchestrator
