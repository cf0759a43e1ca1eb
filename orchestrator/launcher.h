// Launchers run a round's tasks on the modules. The local launcher starts each task as
// `msaflow module <step> --task FILE`, under `mpirun -n N` when it has several ranks; the Slurm
// launcher (a hetjob per round, srun --mpi=pmix per step) implements the same interface.
#pragma once

#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "common/child_process.h"
#include "orchestrator/planner.h"

namespace msaflow::orchestrator {

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

class Launcher {
 public:
  virtual ~Launcher() = default;
  // Runs the tasks in order (each after its dependencies). `task_files` maps task id -> the
  // task file written in the run directory. Throws Error(kTaskFailed) naming the task, its exit
  // status and its log when one fails; later tasks are not started.
  virtual void RunRound(const RoundPlan& plan, const std::map<std::string, std::string>& task_files,
                        const std::string& log_dir, const LaunchObserver& obs) = 0;
};

// SIGINT/SIGTERM to the coordinator: InstallInterruptHandlers makes them set a flag (no
// SA_RESTART, so waits return EINTR) that the launchers check; they then end what they started
// (child processes, Slurm jobs) and throw kTaskFailed "interrupted by signal N".
void InstallInterruptHandlers();
int InterruptSignal();  // 0 until one arrived

// Starts each task as a child process (common/child_process.h) and relays its output. A task
// that fails for a reason in `retry_on` is started again, up to `retries` more times (journal
// event `task-retry`); the reasons a local step fails for are FailureReason's.
class LocalLauncher : public Launcher {
 public:
  explicit LocalLauncher(std::string msaflow_exe, int retries = 0, std::vector<std::string> retry_on = {});
  // "SIGNALED" when a signal ended it (the OOM killer, a watchdog), else "FAILED" (exit status).
  static std::string FailureReason(const ExitStatus& s);
  void RunRound(const RoundPlan& plan, const std::map<std::string, std::string>& task_files, const std::string& log_dir,
                const LaunchObserver& obs) override;
  // The command line of a task: `mpirun -n N --bind-to none msaflow module ...` for several
  // ranks, the module alone for one (an MPI singleton).
  std::vector<std::string> Command(const Task& t, const std::string& task_file) const;

 private:
  std::string exe_;
  std::string mpirun_;
  int retries_ = 0;
  std::vector<std::string> retry_on_;
};

}  // namespace msaflow::orchestrator
