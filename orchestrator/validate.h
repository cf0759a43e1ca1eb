// What `msaflow validate` checks, for any front end (the CLI, the service's POST /v1/runs): the
// pipeline against its machine, the files it names (without reading the datasets), the models'
// operators and feature layers, the NAM URI, the FPGA backend and the train layout.
#pragma once

#include <string>
#include <vector>

#include "workflow/machine.h"
#include "workflow/pipeline.h"

namespace msaflow::orchestrator {

// Throws the first problem as Error ("<origin>: <pointer>: <problem>" where it has a pointer);
// returns the summary lines `msaflow validate` prints under its first line ("train: mode ...").
std::vector<std::string> CheckPipeline(const workflow::Pipeline& p, const workflow::Machine& m,
                                       const std::string& origin, const std::string& runs_dir);

}  // namespace msaflow::orchestrator
