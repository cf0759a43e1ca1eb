// Module entries: `msaflow module <step> --task FILE`. Each step reads its inputs from the NAM
// named in the task and writes its outputs there (docs/modules.md lists them). Rank/size say
// which share of the work this process takes (MSAFLOW_RANK/MSAFLOW_SIZE from the local
// launcher; MPI ranks when launched under mpirun/srun in a later backend).
#pragma once

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

namespace msaflow::modules {

// Runs one step; progress and results go to `out` as lines. Throws Error on failure.
void RunStep(const std::string& step, const nlohmann::json& task, int rank, int size, std::FILE* out);

}  // namespace msaflow::modules
