// Module entries: `msaflow module <step> --task FILE`. Each step reads its inputs from the NAM
// named in the task and writes its outputs there (workflow/objects.h names every object; docs/nam.md
// describes them). A step runs on
// the ranks of `comm` (MPI ranks under mpirun or srun --mpi=pmix; one rank when started by
// hand); docs/parallel.md says what each rank of each step does.
#pragma once

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "nam/store.h"
#include "parallel/comm.h"
#include "workflow/kinds.h"

namespace msaflow::modules {

// Runs one step; progress and results go to `out` as lines (prefixed "[rank] " when there
// are several ranks). Throws Error on failure.
void RunStep(workflow::Step step, const nlohmann::json& task, parallel::Comm& comm, std::FILE* out);

// Runs one step in this process, as one rank, over `store`, if the step has nothing to compute:
// load when every backbone is in the NAM under the digest it would give, prepare when every
// features object is (keys from the dataset digests the NAM caches by file stamps). Then the
// step writes what it writes (prepare's summary, the done object) and true is returned. Else
// false, and nothing is written; so too for the other steps, and on any error (a process
// running the step reports it). The coordinator uses it to spare a settled step its process.
bool RunStepIfSettled(workflow::Step step, const nlohmann::json& task, nam::Store& store, std::FILE* out);

}  // namespace msaflow::modules
