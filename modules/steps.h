// Module entries: `msaflow module <step> --task FILE`. Each step reads its inputs from the NAM
// named in the task and writes its outputs there (workflow/objects.h names every object; docs/nam.md
// describes them). A step runs on
// the ranks of `comm` (MPI ranks under mpirun or srun --mpi=pmix; one rank when started by
// hand); docs/parallel.md says what each rank of each step does.
#pragma once

#include <cstdint>
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

// Runs one step in this process (the coordinator), as one rank, over `store`, where that is
// cheaper than a module process, and returns why it ran here; "" when it did not run it to its
// end (a settled step that finds work writes nothing; a light step that fails may have put some
// of its outputs, which the step's process puts again, versions and all). Two cases:
// - nothing to compute (kNothingToCompute): load when every backbone is in the NAM under the
//   digest it would give, prepare when every features object is (keys from the dataset digests
//   the NAM caches by file stamps), whatever their ranks;
// - a light step of one rank (kLightStep): load, store and select, whose work (a backbone cut
//   and one image dry-run; heads moved from staging to their model objects; shards merged and
//   the champion picked) takes less than a module process takes to start (~0.3-0.5 s: MPI,
//   libfabric and its providers' constructors, the NAM connection).
// - a small step of one rank (kSmallStep): train and evaluate whose heads take at most
//   kSmallStepMacs multiply-adds, estimated before anything is written from the features' shapes
//   (rows x features x outputs, x epochs x 3 for training): about 0.2 s at the ~20 G a second
//   the heads' GEMMs reach on two cores here, less than the process would take to start.
// The step writes what its process would (summary, done object). Any error gives "" too: a
// process running the step then reports it, with the launcher's retries.
std::string RunStepInCoordinator(workflow::Step step, int64_t ranks, const nlohmann::json& task, nam::Store& store,
                                 std::FILE* out);
inline constexpr const char* kNothingToCompute = "nothing to compute: its outputs are in the NAM";
inline constexpr const char* kLightStep = "a light step: less work than starting a module process";
inline constexpr const char* kSmallStep = "a small step: its heads' work is less than starting a module process";
inline constexpr double kSmallStepMacs = 4e9;

}  // namespace msaflow::modules
