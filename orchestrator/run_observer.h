// What a run tells whoever watches it, as it happens: the header lines, each round's start,
// each task's start, output and end, the launcher's events (Slurm jobs, retries), the round
// table and the champion. The run driver calls these and nothing else to be seen; the CLI's
// terminal printer (report/progress.h) is one observer, a service's event stream another. The
// journal (record/journal.h) records the same events for machines, whoever watched. Every
// method does nothing unless overridden, so this base class is also the observer of a run that
// nobody watches.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "orchestrator/planner.h"
#include "orchestrator/rounds.h"

namespace msaflow::orchestrator {

class RunObserver {
 public:
  virtual ~RunObserver() = default;
  virtual void Line(const std::string& text) { (void)text; }  // a line for the user (NAM server, resume)
  // A round of `tasks` tasks begins, `done` of them done before (a resumed run).
  virtual void RoundStart(int round, int64_t max_rounds, size_t fresh, size_t kept, size_t tasks, size_t done) {
    (void)round, (void)max_rounds, (void)fresh, (void)kept, (void)tasks, (void)done;
  }
  virtual void TaskStart(const Task& t) { (void)t; }
  virtual void TaskOutput(const Task& t, const std::string& line) { (void)t, (void)line; }
  virtual void TaskEnd(const Task& t, double seconds) { (void)t, (void)seconds; }
  virtual void TaskReused(const Task& t, size_t outputs) { (void)t, (void)outputs; }  // done by an earlier coordinator
  virtual void LauncherEvent(const std::string& event, const nlohmann::json& fields) { (void)event, (void)fields; }
  virtual void Tick() {}  // while a task runs (the launcher's liveness poll)
  // A round ended: its outcome (the round table: metrics on the split candidates are selected on).
  virtual void RoundTable(const Pipeline& p, int round, const RoundOutcome& o) { (void)p, (void)round, (void)o; }
  // The run ended: the champion, its held-out result, the best per backbone, why it stopped.
  virtual void Finish(const Pipeline& p, const RoundLoop& loop, double seconds, const std::string& run_dir) {
    (void)p, (void)loop, (void)seconds, (void)run_dir;
  }
};

}  // namespace msaflow::orchestrator
