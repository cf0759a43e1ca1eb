// What `msaflow run` prints as it goes, as plain lines: the run's header, each round's start,
// each task's start, output and end (the launch observer's callbacks land here), the Slurm
// jobs, the round table and the champion. On a terminal a progress bar (the round's tasks done,
// the one running and its clock) stays below them. The journal records the same events for
// machines.
#pragma once

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "orchestrator/run_observer.h"
#include "report/progress_bar.h"

namespace msaflow::report {

using orchestrator::Pipeline;
using orchestrator::RoundLoop;
using orchestrator::RoundOutcome;
using orchestrator::Task;

class ProgressPrinter : public orchestrator::RunObserver {
 public:
  explicit ProgressPrinter(std::FILE* out, Clock* clock = &SystemClock()) : out_(out), bar_(out, clock) {}
  ProgressPrinter(std::FILE* out, bool bar, Clock* clock = &SystemClock()) : out_(out), bar_(out, bar, clock) {}
  void Line(const std::string& text) override;  // printed as is, flushed
  // A round of `tasks` tasks begins, `done` of them done before (a resumed run).
  void RoundStart(int round, int64_t max_rounds, size_t fresh, size_t kept, size_t tasks, size_t done) override;
  void TaskStart(const Task& t) override;
  void TaskOutput(const Task& t, const std::string& line) override;
  void TaskEnd(const Task& t, double seconds) override;
  void TaskReused(const Task& t, size_t outputs) override;  // done by an earlier coordinator of the run
  void LauncherEvent(const std::string& event, const nlohmann::json& fields) override;
  void Tick() override { bar_.Tick(); }  // the running task's clock (called while the launcher waits)
  // The round table (metrics on the split candidates are selected on) and the round's best.
  void RoundTable(const Pipeline& p, int round, const RoundOutcome& o) override;
  // The champion, its held-out result, the best per backbone, why the run stopped.
  void Finish(const Pipeline& p, const RoundLoop& loop, double seconds, const std::string& run_dir) override;

 private:
  std::FILE* out_;
  ProgressBar bar_;
  std::string coordinator_why_;  // of the task the coordinator runs next (event task-in-coordinator)
};

}  // namespace msaflow::report
