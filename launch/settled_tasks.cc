#include "launch/settled_tasks.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "common/files.h"

namespace msaflow::launch {

namespace {

bool InCoordinatorOn() {
  const char* v = std::getenv("MSAFLOW_IN_COORDINATOR");
  return !(v && std::string(v) == "0");
}

// A step's output, caught in memory: its lines go to the observer only once it is known to
// have run here (a step that finds work writes nothing and is started as a process).
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

RoundPlan RunSettledTasks(const RoundPlan& plan, const SettledRunner& run, nam::Store& store,
                          const std::string& log_dir, const LaunchObserver& obs, std::set<std::string>* ran, Clock& clock) {
  RoundPlan rest{plan.round, {}};
  size_t i = 0;
  for (; run && InCoordinatorOn() && i < plan.tasks.size(); ++i) {
    const Task& t = plan.tasks[i];
    CapturedOutput out;
    if (!out.file()) break;
    const auto t0 = clock.Now();
    if (!run(t.step, t.body, store, out.file())) break;
    const double secs = clock.SecondsSince(t0);
    const std::string text = out.Text();
    Task here = t;
    here.module = "coordinator";
    here.ranks = 1;
    if (obs.on_event)
      obs.on_event("task-in-coordinator", {{"task", t.id}, {"step", t.step}, {"module", t.module},
                                           {"why", "nothing to compute: its outputs are in the NAM"}});
    if (obs.on_start) obs.on_start(here);
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);)
      if (obs.on_line) obs.on_line(here, line);
    WriteFileAtomic(log_dir + "/" + t.id + ".log", text);
    if (obs.on_end) obs.on_end(here, secs);
    ran->insert(t.id);
  }
  for (; i < plan.tasks.size(); ++i) {
    Task t = plan.tasks[i];
    t.after.erase(std::remove_if(t.after.begin(), t.after.end(), [&](const std::string& a) { return ran->count(a); }),
                  t.after.end());
    rest.tasks.push_back(std::move(t));
  }
  return rest;
}

}  // namespace msaflow::launch
