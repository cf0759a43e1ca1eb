// What `msaflow run` prints as it goes, as plain lines: the run's header, each round's start,
// each task's start, output and end (the launch observer's callbacks land here), the Slurm
// jobs, the round table and the champion. On a terminal a progress bar (the round's tasks done,
// the one running and its clock) stays below them. The journal records the same events for
// machines.
#pragma once

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "orchestrator/planner.h"
#include "orchestrator/progress_bar.h"
#include "orchestrator/rounds.h"

namespace msaflow::orchestrator {

class ProgressPrinter {
 public:
  explicit ProgressPrinter(std::FILE* out) : out_(out), bar_(out) {}
  ProgressPrinter(std::FILE* out, bool bar) : out_(out), bar_(out, bar) {}
  void Line(const std::string& text);  // printed as is, flushed
  // A round of `tasks` tasks begins, `done` of them done before (a resumed run).
  void RoundStart(int round, int64_t max_rounds, size_t fresh, size_t kept, size_t tasks, size_t done);
  void TaskStart(const Task& t);
  void TaskOutput(const Task& t, const std::string& line);
  void TaskEnd(const Task& t, double seconds);
  void TaskReused(const Task& t, size_t outputs);  // done by an earlier coordinator of the run
  void LauncherEvent(const std::string& event, const nlohmann::json& fields);
  void Tick() { bar_.Tick(); }  // the running task's clock (called while the launcher waits)
  // The round table (metrics on the split candidates are selected on) and the round's best.
  void RoundTable(const Pipeline& p, int round, const RoundOutcome& o);
  // The champion, its held-out result, the best per backbone, why the run stopped.
  void Finish(const Pipeline& p, const RoundLoop& loop, double seconds, const std::string& run_dir);

 private:
  std::FILE* out_;
  ProgressBar bar_;
};

}  // namespace msaflow::orchestrator
