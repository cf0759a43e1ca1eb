// A one-line progress bar redrawn in place when its stream is a terminal:
//   round 1/3 [######..............] 2/6 tasks  train on dam 3.1 s
// Lines printed through it appear above the bar; on anything but a terminal (a file, a pipe, a
// Slurm output file) it draws nothing and lines print as they are. `msaflow run` (through the
// progress printer) and `submit --wait` (from the journal) drive it.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

#include "common/clock.h"

namespace msaflow::report {

class ProgressBar {
 public:
  // Enabled when `out` is a terminal and TERM is not "dumb" (force: enabled or not, for tests).
  // The running task's clock reads `clock`.
  explicit ProgressBar(std::FILE* out, Clock* clock = &SystemClock());
  ProgressBar(std::FILE* out, bool enabled, Clock* clock = &SystemClock())
      : out_(out), clock_(clock), enabled_(enabled) {}
  ~ProgressBar() { Clear(); }  // a run that fails says so on a clean line
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;
  bool enabled() const { return enabled_; }

  void Round(int round, int64_t max_rounds, size_t tasks, size_t done);  // a round begins
  void Start(const std::string& what);  // the task now running ("train on dam")
  void Done();                          // a task ended; the last one leaves the full bar in place
  void Tick();                          // redraws (the running task's clock)
  void Print(const std::string& line);  // a line above the bar (printed as is when disabled)
  void Clear();                         // takes the bar off the screen until the next draw

  // The bar's text (no I/O).
  static std::string Render(int round, int64_t max_rounds, size_t done, size_t total, const std::string& what,
                            double seconds);

 private:
  void Draw();
  std::FILE* out_;
  Clock* clock_;
  bool enabled_ = false, shown_ = false, active_ = false;
  int round_ = 0;
  int64_t max_ = 0;
  size_t total_ = 0, done_ = 0;
  std::string what_;
  Clock::TimePoint since_{};
};

}  // namespace msaflow::report
