// Module entries: `msaflow module <step> --task FILE`. Each step reads its inputs from the NAM
// named in the task and writes its outputs there (docs/modules.md lists them). A step runs on
// the ranks of `comm` (MPI ranks under mpirun or srun --mpi=pmix; one rank when started by
// hand); docs/parallel.md says what each rank of each step does.
#pragma once

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "parallel/comm.h"

namespace msaflow::modules {

// Runs one step; progress and results go to `out` as lines (prefixed "[rank] " when there
// are several ranks). Throws Error on failure.
void RunStep(const std::string& step, const nlohmann::json& task, parallel::Comm& comm, std::FILE* out);

}  // namespace msaflow::modules
