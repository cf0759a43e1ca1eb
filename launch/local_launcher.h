// The local launcher: each task a child process on this machine, `msaflow module <step> --task
// FILE`, under `mpirun -n N` when it has several ranks (Open MPI's shared-memory transport,
// oversubscribing the cores if need be), its output relayed line by line.
#pragma once

#include <string>
#include <vector>

#include "launch/launcher.h"

namespace msaflow::launch {

// A task that fails for a reason in the pipeline's retries.on is started again, up to
// retries.max more times (journal event `task-retry`); the reasons a local step fails for are
// FailureReason's.
class LocalLauncher : public Launcher {
 public:
  LocalLauncher(Pipeline p, Machine m, LaunchContext ctx);
  // "SIGNALED" when a signal ended it (the OOM killer, a watchdog), or ended one of its ranks
  // (`rank_signal`: mpirun then exits 128 + N, and may say which rank), else "FAILED".
  static std::string FailureReason(const ExitStatus& s, int rank_signal = 0);
  // The rank and signal in mpirun's "process rank R ... exited on signal N (...)" line; false
  // for any other line.
  static bool RankSignal(const std::string& line, int* rank, int* signal);
  bool RunsStepsInCoordinator() const override { return true; }
  void RunRound(const RoundPlan& plan, const std::map<std::string, std::string>& task_files, const std::string& log_dir,
                const LaunchObserver& obs) override;
  std::string PlanNam(const std::string& nam, const std::string& persist_dir) const override;
  std::string PlanText(const RoundPlan& round1, const std::string& nam, const std::string& runs_dir) const override;
  // The command line of a task: `mpirun -n N --bind-to none msaflow module ...` for several
  // ranks, the module alone for one (an MPI singleton).
  std::vector<std::string> Command(const Task& t, const std::string& task_file) const;

 private:
  std::string mpirun_;
};

}  // namespace msaflow::launch
