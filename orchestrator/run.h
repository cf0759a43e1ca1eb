// A run: rounds of the five steps until the stop rule, recorded in runs/<id>/ (docs/formats.md):
// pipeline.json, journal.jsonl (orchestrator/journal.h), coordinator.lock
// (orchestrator/coordinator_lock.h), tasks/*.json, logs/*.log, results.json.
#pragma once

#include <cstdio>
#include <string>

#include "orchestrator/launcher.h"
#include "orchestrator/settled_tasks.h"
#include "orchestrator/machine.h"
#include "orchestrator/nam_process.h"
#include "orchestrator/rounds.h"
#include "workflow/pipeline.h"

namespace msaflow::orchestrator {

struct RunOptions {
  std::string runs_dir = "runs";
  std::string msaflow_exe;  // started as `msaflow nam serve` when the run needs a NAM server
  std::string run_id;  // "" = <name>-<timestamp>-<random>
  bool verbose = false;
  // Runs a step that has nothing to compute in the coordinator (orchestrator/settled_tasks.h);
  // empty: every step is a process.
  SettledRunner run_settled;
};

// Runs the pipeline to the end; returns the run directory. Progress goes to `out`.
// Throws Error (kTaskFailed when a task fails, kUnavailable when the NAM server dies; the
// journal records it). The launcher is the machine's (local processes, or Slurm jobs) unless
// one is given. The run directory appears whole (journal, pipeline) or not at all.
std::string RunPipeline(const Pipeline& p, const Machine& m, const RunOptions& opt, std::FILE* out,
                        Launcher* launcher = nullptr);

// Finishes a run whose coordinator died or failed (`msaflow resume`): the same pipeline and
// machine, rounds replayed from the NAM, and every task whose done object is in the NAM
// reused, not run again; the rest run as they would have. Throws kInvalidInput while the run's
// coordinator is alive. A finished run is left as it is (returns false).
bool ResumeRun(const std::string& run_dir, const RunOptions& opt, std::FILE* out, Launcher* launcher = nullptr);

// The NAM a run uses: the pipeline's URI, else the machine's, else "serve" (a server the run
// starts, persisting to <runs>/nam) when the machine asks for one, else file://<runs>/nam.
std::string NamFor(const Pipeline& p, const Machine& m, const std::string& runs_dir);

// How a run starts its NAM server: a child process, or under Slurm (machine nam.module) an
// srun into the coordinator's NAM component (MSAFLOW_NAM_HET_GROUP, set by `submit`) or into a
// job of its own. Off loopback it writes a token file into `run_dir`.
NamLaunch NamLaunchFor(const Machine& m, const std::string& run_id, const std::string& run_dir);

// "<name>-<UTC time>-<4 hex digits>".
std::string NewRunId(const std::string& name);

// The results.json of the latest finished run of pipeline `name` under `runs_dir` (by the
// file's modification time), or "" when there is none. Unreadable results files are skipped.
std::string LastResults(const std::string& runs_dir, const std::string& name);


}  // namespace msaflow::orchestrator
