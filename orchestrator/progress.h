// What `msaflow run` prints as it goes, as plain lines: the run's header, each round's start,
// each task's start, output and end (the launch observer's callbacks land here), the Slurm
// jobs, the round table and the champion. The journal records the same events for machines.
#pragma once

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "orchestrator/planner.h"
#include "orchestrator/rounds.h"

namespace msaflow::orchestrator {

class ProgressPrinter {
 public:
  explicit ProgressPrinter(std::FILE* out) : out_(out) {}
  void Line(const std::string& text) const;  // printed as is, flushed
  void RoundStart(int round, int64_t max_rounds, size_t fresh, size_t kept) const;
  void TaskStart(const Task& t) const;
  void TaskOutput(const Task& t, const std::string& line) const;
  void TaskEnd(const Task& t, double seconds) const;
  void TaskReused(const Task& t, size_t outputs) const;  // done by an earlier coordinator of the run
  void LauncherEvent(const std::string& event, const nlohmann::json& fields) const;
  // The round table (metrics on the split candidates are selected on) and the round's best.
  void RoundTable(const Pipeline& p, int round, const RoundOutcome& o) const;
  // The champion, its held-out result, the best per backbone, why the run stopped.
  void Finish(const Pipeline& p, const RoundLoop& loop, double seconds, const std::string& run_dir) const;

 private:
  std::FILE* out_;
};

}  // namespace msaflow::orchestrator
