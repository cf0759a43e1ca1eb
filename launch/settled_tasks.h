// Steps with nothing to compute run in the coordinator, not as module processes. Round 2 on
// finds every backbone and every features object in the NAM: its load and prepare only check
// that and write their summary, some milliseconds of work, where a module process spends about
// half a second starting (MPI, libfabric and its providers' constructors, the NAM connection).
// The local launcher's rounds use this; a Slurm round's steps all run in its job(s).
#pragma once

#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "common/clock.h"
#include "nam/store.h"
#include "launch/launcher.h"
#include "workflow/kinds.h"

namespace msaflow::launch {

// Runs a step in this process when it has nothing to compute, and says whether it did: the
// signature of modules::RunStepIfSettled, which cli/ passes in (orchestrator/ does not depend
// on modules/).
using SettledRunner =
    std::function<bool(workflow::Step step, const nlohmann::json& task, nam::Store& store, std::FILE* out)>;

// Runs the plan's leading tasks that `run` finds settled, in order, over `store`, reporting each through `obs` as a launcher does (event "task-in-coordinator", then
// start, output lines, end) and writing its log to log_dir/<task>.log. Stops at the first task
// that is not settled and returns the rest of the plan, without the tasks run here among the
// others' dependencies; their ids are added to `ran`. MSAFLOW_IN_COORDINATOR=0 turns it off.
RoundPlan RunSettledTasks(const RoundPlan& plan, const SettledRunner& run, nam::Store& store,
                          const std::string& log_dir, const LaunchObserver& obs, std::set<std::string>* ran,
                          Clock& clock);

}  // namespace msaflow::launch
