// A run: rounds of the five steps until the stop rule, recorded in runs/<id>/ (docs/formats.md):
// the pipeline, the journal and the results (record/run_dir.h), coordinator.lock
// (record/coordinator_lock.h), tasks/*.json, logs/*.log, provenance.json. The round loop is here; how its tasks
// run is the launcher's (launch/launcher.h); what it shows goes to a RunObserver. Most callers
// want the Runs API (orchestrator/runs.h) around these.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "common/clock.h"
#include "launch/launcher.h"
#include "launch/coordinator_tasks.h"
#include "orchestrator/rounds.h"
#include "orchestrator/run_observer.h"
#include "workflow/machine.h"
#include "workflow/pipeline.h"

namespace msaflow::orchestrator {

using LauncherFactory =
    std::function<std::unique_ptr<launch::Launcher>(const Pipeline&, const Machine&, launch::LaunchContext)>;

struct RunOptions {
  std::string runs_dir = "runs";
  std::string msaflow_exe;  // what tasks run as, and what is started as `msaflow nam serve`
  std::string run_id;  // "" = <name>-<timestamp>-<random>
  // Runs a step that costs less than a process in the coordinator (launch/coordinator_tasks.h),
  // where the launcher allows it; empty: every step is a task.
  launch::CoordinatorRunner run_here;
  Clock* clock = &SystemClock();
  // The launcher; empty: the machine's (launch::MakeLauncher). Tests give a fake.
  LauncherFactory make_launcher;
  // A resume's: why it was resumed and by whom, recorded in the journal's resume event ("" =
  // asked for by hand, nothing recorded).
  std::string resume_reason;
};

// Runs the pipeline to the end; returns the run directory. Throws Error (kTaskFailed when a task
// fails, kUnavailable when the NAM server dies; the journal records it). The run directory
// appears whole (journal, pipeline) or not at all.
std::string RunPipeline(const Pipeline& p, const Machine& m, const RunOptions& opt, RunObserver& obs);

// Finishes a run whose coordinator died or failed (`msaflow resume`): the same pipeline and
// machine, rounds replayed from the NAM, and every task whose done object is in the NAM
// reused, not run again; the rest run as they would have. Throws kInvalidInput while the run's
// coordinator is alive. A finished run is left as it is (returns false). `opt.runs_dir` is
// the run directory's parent.
bool ResumeRun(const std::string& run_dir, const RunOptions& opt, RunObserver& obs);

// The checks a run makes before it writes anything: the NAM URI, fpga "opencl" with no OpenCL
// device here, labels or splits no model can be trained on, models prepare could not feed.
// Returns the NAM the run will use (NamFor).
std::string PreRunChecks(const Pipeline& p, const Machine& m, const std::string& runs_dir);
// A mem:// NAM for a run whose steps are processes: refused (kInvalidInput naming /nam).
void CheckNotInProcessNam(const Pipeline& p);
// Ranks a pipeline asks for beyond its module's max_ranks: refused, the maximum named (a run
// would otherwise get fewer than it asked for without a word).
void CheckRanks(const Pipeline& p, const Machine& m);

// The NAM a run uses: the pipeline's URI, else the machine's, else "serve" (a server the run
// starts, persisting to <runs>/nam) when the machine asks for one, else file://<runs>/nam.
std::string NamFor(const Pipeline& p, const Machine& m, const std::string& runs_dir);

// A run directory's cancel request (Runs::Cancel writes it before it signals the coordinator):
// {"by", "time"}. A coordinator that is interrupted while it is there records the run as
// cancelled rather than failed; a resume removes it.
inline constexpr char kCancelRequest[] = "cancel-request.json";

// "<name>-<UTC time>-<4 hex digits>".
std::string NewRunId(const std::string& name);

}  // namespace msaflow::orchestrator
