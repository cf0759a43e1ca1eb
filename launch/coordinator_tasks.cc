#include "launch/coordinator_tasks.h"

#include <cstdlib>
#include <sstream>

#include "common/files.h"
#include "common/signals.h"

namespace msaflow::launch {

namespace {

bool InCoordinatorOn() {
  const char* v = std::getenv("MSAFLOW_IN_COORDINATOR");
  return !(v && std::string(v) == "0");
}

// A step's output, caught in memory: its lines go to the observer only once it is known to
// have run here (a step that does not run here is started as a process, which writes its own).
class CapturedOutput {
 public:
  CapturedOutput() : file_(::open_memstream(&buf_, &size_)) {}
  ~CapturedOutput() {
    if (file_) std::fclose(file_);
    std::free(buf_);
  }
  CapturedOutput(const CapturedOutput&) = delete;
  CapturedOutput& operator=(const CapturedOutput&) = delete;
  std::FILE* file() const { return file_; }
  std::string Text() {
    std::fflush(file_);
    return buf_ ? std::string(buf_, size_) : std::string();
  }

 private:
  char* buf_ = nullptr;
  size_t size_ = 0;
  std::FILE* file_;
};

}  // namespace

std::string RunTaskInCoordinator(const Task& t, const CoordinatorRunner& run, nam::Store& store,
                                 const std::string& log_dir, const LaunchObserver& obs, Clock& clock) {
  if (!run || !InCoordinatorOn()) return "";
  CapturedOutput out;
  if (!out.file()) return "";
  // The step may compute (oneDNN, OpenMP, OpenCL): no stop signal lands in it meanwhile.
  const InterruptsHeld held;
  const auto t0 = clock.Now();
  std::string why = run(t.step, t.ranks, t.body, store, out.file());
  if (why.empty()) return "";
  const double secs = clock.SecondsSince(t0);
  const std::string text = out.Text();
  Task here = t;
  here.module = "coordinator";
  here.ranks = 1;
  if (obs.on_event)
    obs.on_event("task-in-coordinator", {{"task", t.id}, {"step", t.step}, {"module", t.module}, {"why", why}});
  if (obs.on_start) obs.on_start(here);
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);)
    if (obs.on_line) obs.on_line(here, line);
  WriteFileAtomic(log_dir + "/" + t.id + ".log", text);
  if (obs.on_end) obs.on_end(here, secs);
  held.ThrowIfInterrupted("after task " + t.id + " (run in the coordinator)");
  return why;
}

}  // namespace msaflow::launch
