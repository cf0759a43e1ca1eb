// The run as a library: what the `msaflow` commands do with runs, for any front end (the CLI, a
// service). A Runs object is bound to one runs directory. It plans, starts (blocking, reporting
// to a RunObserver), resumes, submits to a batch system, cancels and observes runs; everything
// launcher-specific goes through the machine's launcher (launch/launcher.h), and what a run
// looks like from outside comes from its journal (record/).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "common/child_process.h"
#include "orchestrator/run.h"
#include "record/journal.h"
#include "record/status.h"
#include "workflow/machine.h"
#include "workflow/pipeline.h"

namespace msaflow::orchestrator {

struct RunsConfig {
  std::string runs_dir = "runs";
  std::string msaflow_exe;  // what tasks and NAM servers run as
  launch::CoordinatorRunner run_here;
  Clock* clock = &SystemClock();
  LauncherFactory make_launcher;  // empty: the machine's launcher
};

// What `submit` left: the run's directory and the job its coordinator runs in.
struct SubmittedRun {
  std::string run_id, run_dir, job, where;
};

// A run's coordinator as a process of its own, a child of the caller: how a long-lived front
// end (the service) starts, submits and resumes runs, as Ray's job supervisors do. The command
// it runs is built in Runs alone.
struct CoordinatorStart {
  enum class Kind {
    kRun,     // a new run, its coordinator this child (`msaflow run`)
    kSubmit,  // a new run whose coordinator the machine's batch system starts (`msaflow submit`)
    kResume,  // a run that began, continued (`msaflow resume`)
  };
  Kind kind = Kind::kRun;
  std::string pipeline_path, machine_arg, run_id;  // kRun, kSubmit: what the coordinator reads; the id in runs_dir
  std::string reason;                              // kResume: why, and by whom, for its journal
};

class Runs {
 public:
  explicit Runs(RunsConfig config);
  const RunsConfig& config() const { return config_; }

  // `msaflow plan`: round 1 as the machine's launcher would run it (its commands, or its batch
  // script: then PlanIsScript, and what else the caller prints must be `#` comments).
  std::string Plan(const Pipeline& p, const Machine& m) const;
  bool PlanIsScript(const Pipeline& p, const Machine& m) const;

  // Runs the pipeline here to its end (blocking); returns the run directory. run_id "" = a new one.
  std::string Start(const Pipeline& p, const Machine& m, const std::string& run_id, RunObserver& obs) const;
  // Finishes a run whose coordinator died or failed; false when it had finished. `reason`, when
  // given, is why (and by whom) it is resumed: the journal's resume event records it.
  bool Resume(const std::string& run_dir, RunObserver& obs, const std::string& reason = "") const;

  // Hands the run's coordinator to the machine's batch system (`msaflow submit`): the run
  // directory is made, the coordinator's job script written and submitted. `pipeline_path` and
  // `machine_arg` are what the coordinator's `msaflow run` will read.
  SubmittedRun Submit(const Pipeline& p, const Machine& m, const std::string& pipeline_path,
                      const std::string& machine_arg, const std::string& run_id) const;
  // The submitted coordinator job's end state, "" while it is queued or runs.
  std::string SubmittedEnd(const Pipeline& p, const Machine& m, const std::string& job) const;

  // Asks a run to stop: the request is written into the run directory (kCancelRequest) and its
  // live coordinator gets SIGTERM (it ends what it started, and the journal records the run as
  // cancelled by `by`; `Resume` continues it). Returns what was done, for the user. Throws
  // kInvalidInput when no coordinator of the run is alive here.
  std::string Cancel(const std::string& run_dir, const std::string& by) const;
  // The request alone, for a coordinator started but not yet holding its run (one that begins
  // the run after the signal then records it as cancelled by `by`, not as interrupted). Makes
  // the run directory if it is not there yet.
  static void RequestCancel(const std::string& run_dir, const std::string& by);

  // Starts the coordinator process `c` asks for (run_dir() of its id), `o` saying where its
  // output goes and how it is tied to the caller. Throws as ChildProcess::Start does.
  ChildProcess StartCoordinator(const CoordinatorStart& c, const SpawnOptions& o) const;
  std::string run_dir(const std::string& run_id) const { return config_.runs_dir + "/" + run_id; }

  // The run followed from outside: its journal's events as they are written, typed, each
  // Next() reading only what was appended since (record::JournalFollower). Its state now is
  // record::StatusOf's.
  record::JournalFollower Observe(const std::string& run_dir) const;

 private:
  RunOptions Options(const std::string& run_id) const;
  std::unique_ptr<launch::Launcher> LauncherFor(const Pipeline& p, const Machine& m, const std::string& run_id,
                                                const std::string& run_dir) const;
  RunsConfig config_;
};

}  // namespace msaflow::orchestrator
