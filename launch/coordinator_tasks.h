// Steps run in the coordinator, not as module processes, where a process would cost more than
// the step: round 2 on finds every backbone and every features object in the NAM, so its load
// and prepare only check that and write their summary; store and select (and a first load) move
// small objects. A module process spends ~0.3-0.5 s starting (MPI, libfabric and its providers'
// constructors, the NAM connection) where these take milliseconds. The local launcher's rounds
// use this; a Slurm round's steps all run in its job(s).
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "common/clock.h"
#include "common/signals.h"
#include "launch/launcher.h"
#include "nam/store.h"
#include "workflow/kinds.h"

namespace msaflow::launch {

// Runs a task's step in this process where that is cheaper than a process, and says why it did
// ("" when it did not, or not to its end: the step's process then runs it whole): the
// signature of modules::RunStepInCoordinator,
// which cli/ passes in (orchestrator/ does not depend on modules/).
using CoordinatorRunner = std::function<std::string(workflow::Step step, int64_t ranks, const nlohmann::json& task,
                                                    nam::Store& store, std::FILE* out)>;

// Runs `t` here through `run` if it takes it, over `store`, reporting it through `obs` as a
// launcher does (event "task-in-coordinator" with its `why`, then start, output lines, end; its
// log to log_dir/<task>.log), and returns the why; "" when `run` did not take it (the caller
// starts it as a process). SIGINT/SIGTERM are held while the step computes (InterruptsHeld); one
// that came meanwhile throws once the task is reported. MSAFLOW_IN_COORDINATOR=0 turns it off.
std::string RunTaskInCoordinator(const Task& t, const CoordinatorRunner& run, nam::Store& store,
                                 const std::string& log_dir, const LaunchObserver& obs, Clock& clock);

}  // namespace msaflow::launch
