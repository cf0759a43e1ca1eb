// Launchers put a run's work on the machine. Everything that differs between running here and
// running under Slurm lives behind this one interface: how a round's tasks run, what may run in
// the coordinator instead, how the run's NAM server is placed, re-attaching to what a dead
// coordinator left running, what a round cost in node-seconds, the plan text, and `submit`.
// MakeLauncher builds the machine's launcher (local: launch/local_launcher.cc; Slurm:
// launch/slurm.cc); no other place looks at the machine's launcher kind.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/child_process.h"
#include "common/clock.h"
#include "launch/job_runner.h"
#include "launch/nam_process.h"
#include "workflow/machine.h"
#include "workflow/pipeline.h"
#include "workflow/task.h"

namespace msaflow::launch {

using workflow::Machine;
using workflow::ModuleSpec;
using workflow::Pipeline;
using workflow::RoundPlan;
using workflow::Task;

struct LaunchObserver {
  std::function<void(const Task&)> on_start;
  std::function<void(const Task&, const std::string& line)> on_line;  // a line a task printed
  std::function<void(const Task&, double seconds)> on_end;
  // Launcher-specific events for the journal (a Slurm job submitted, its states, a retry).
  std::function<void(const std::string& event, nlohmann::json fields)> on_event;
  // Liveness: polled every 200 ms while a task runs; a non-empty answer (the run's NAM server
  // died) ends the running task at once and fails the round with that answer (kUnavailable).
  std::function<std::string()> check;
};
inline constexpr int kLivenessPollMs = 200;

// What a launcher is built with. `run_id` and `run_dir` may be placeholders ("<run-id>") for a
// launcher that only plans.
struct LaunchContext {
  std::string run_id, run_dir;
  std::string msaflow_exe;  // what tasks run as `msaflow module ...`
  Clock* clock = &SystemClock();
  // Slurm's commands (sbatch, scontrol, scancel, squeue). Null: the real ones (SlurmCli with the
  // machine's slurm.conf), owned by the launcher. A given one must outlive the launcher.
  JobRunner* jobs = nullptr;
};

// What a dead coordinator of the run left running, from its journal.
struct Leftovers {
  std::vector<std::string> jobs;  // Slurm jobs of its last round
  std::string nam_job;            // its NAM server's Slurm job
};

// `msaflow submit`: the run's coordinator as a job of its own.
struct SubmitRequest {
  std::string pipeline_path;  // absolute
  std::string machine_arg;    // "local" or an absolute path, as `run --machine` takes it
  std::string runs_dir;       // absolute
};
struct Submitted {
  std::string job;    // the coordinator's job
  std::string where;  // where the coordinator runs, for the user ("partition cm")
};

class Launcher {
 public:
  virtual ~Launcher() = default;

  // Once, before anything of the run starts: what the run's own commands need in the
  // coordinator's environment (SLURM_CONF).
  virtual void SetUpEnvironment() {}

  // Whether a step that costs less than a process may run in the coordinator rather than as a
  // task (launch/coordinator_tasks.h): locally yes; under Slurm every step runs in the round's
  // jobs. A launcher that says yes runs a round's tasks one after another in the plan's order,
  // so the coordinator may hand it the tasks one at a time.
  virtual bool RunsStepsInCoordinator() const = 0;

  // How the run's own NAM server is started (see NamLaunch): a token off loopback (written to
  // run_dir/nam-token), and under Slurm an srun onto the machine's NAM module.
  NamLaunch NamServerLaunch() const;

  // Re-attaches to what a dead coordinator of the run left running: waits for its jobs to end, or
  // cancels them when they cannot finish. `say` gets a line for the user. Returns the journal's
  // "slurm-reattached" fields, or null when there was nothing to re-attach to.
  virtual nlohmann::json Reattach(const Leftovers& left, const std::function<void(const std::string&)>& say) {
    (void)left;
    (void)say;
    return nullptr;
  }

  // Runs the tasks in order (each after its dependencies). `task_files` maps task id -> the
  // task file written in the run directory. Throws Error(kTaskFailed) naming the task, its exit
  // status and its log when one fails; later tasks are not started.
  virtual void RunRound(const RoundPlan& plan, const std::map<std::string, std::string>& task_files,
                        const std::string& log_dir, const LaunchObserver& obs) = 0;

  // After a round that RunRound ran: what the round cost on the machine (Slurm: node-seconds
  // held and used per module; the run's results, "node_seconds"), and a line saying so in `summary`.
  // Null when the launcher has nothing to say. `step_seconds`: step -> its seconds.
  virtual nlohmann::json RoundAccount(const std::map<std::string, double>& step_seconds, std::string* summary) {
    (void)step_seconds;
    (void)summary;
    return nullptr;
  }

  // `msaflow plan`: the NAM as the plan shows it, given what NamFor chose ("serve": a server the
  // run starts, persisting to persist_dir).
  virtual std::string PlanNam(const std::string& nam, const std::string& persist_dir) const = 0;
  // Round 1 as this launcher would run it. For a launcher whose runs are batch jobs (`batch`)
  // it is a batch script, and everything else `plan` prints is a `#` comment.
  virtual std::string PlanText(const RoundPlan& round1, const std::string& nam, const std::string& runs_dir) const = 0;
  virtual bool batch() const { return false; }

  // `msaflow submit`, on a batch launcher: writes the coordinator's job script into the run
  // directory (which exists) and submits it. Throws kInvalidInput on any other launcher.
  virtual Submitted Submit(const SubmitRequest& req);
  // The end state of a submitted coordinator job: "" while it is queued or runs, else
  // "COMPLETED", "FAILED", ... ("FAILED" when the batch system has forgotten it).
  virtual std::string SubmittedJobEnd(const std::string& job);

 protected:
  Launcher(Pipeline p, Machine m, LaunchContext ctx) : p_(std::move(p)), m_(std::move(m)), ctx_(std::move(ctx)) {}
  // The srun (or other) prefix that places the NAM server; empty: a plain child process.
  virtual void PlaceNamServer(NamLaunch* launch) const { (void)launch; }
  int retries() const { return static_cast<int>(p_.retries.max); }
  const std::vector<std::string>& retry_on() const { return p_.retries.on; }

  Pipeline p_;
  Machine m_;
  LaunchContext ctx_;
};

// Whether the machine's NAM server listens on loopback (then it needs no token, and a local run
// shares the runs directory's server, launch/shared_nam.h). Throws kInvalidInput for a bad address.
bool NamOnLoopback(const Machine& m);
// How long a run's NAM server waits for its predecessor on the same persisted objects to let go:
// on this node, and placed by a batch system (a lost node's job ends only once it is back).
inline constexpr double kNamLockWaitHereS = 15, kNamLockWaitPlacedS = 90;

// The machine's launcher for a run of `p`.
std::unique_ptr<Launcher> MakeLauncher(const Pipeline& p, const Machine& m, LaunchContext ctx);

}  // namespace msaflow::launch
