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

// Fine-tuning as the pipeline asks for it, a line per backbone with train_from: the layers that
// train, from which round, on which module and ranks, and the maps cached in the NAM with their
// bytes. Throws kInvalidInput when the maps of every split would not fit the NAM server's
// capacity that the machine gives a run. Reads the datasets' sizes.
std::vector<std::string> FinetuneLines(const workflow::Pipeline& p, const workflow::Machine& m);

}  // namespace msaflow::orchestrator
