#include "report/progress_bar.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include <fmt/core.h>

namespace msaflow::report {

namespace {
constexpr size_t kBarWidth = 20;
}

ProgressBar::ProgressBar(std::FILE* out, Clock* clock) : out_(out), clock_(clock) {
  const char* term = std::getenv("TERM");
  enabled_ = ::isatty(::fileno(out)) == 1 && !(term && std::strcmp(term, "dumb") == 0);
}

std::string ProgressBar::Render(int round, int64_t max_rounds, size_t done, size_t total, const std::string& what,
                                double seconds) {
  const size_t filled = total ? std::min(kBarWidth, done * kBarWidth / total) : 0;
  std::string s = fmt::format("round {}/{} [{}{}] {}/{} tasks", round, max_rounds, std::string(filled, '#'),
                              std::string(kBarWidth - filled, '.'), done, total);
  if (!what.empty()) s += fmt::format("  {} {:.1f} s", what, seconds);
  return s;
}

void ProgressBar::Round(int round, int64_t max_rounds, size_t tasks, size_t done) {
  round_ = round, max_ = max_rounds, total_ = tasks, done_ = done;
  what_.clear();
  active_ = done < tasks;
  Draw();
}

void ProgressBar::Start(const std::string& what) {
  what_ = what;
  since_ = clock_->Now();
  Draw();
}

void ProgressBar::Done() {
  if (!active_) return;
  ++done_;
  what_.clear();
  Draw();
  if (done_ >= total_) {  // the full bar stays, and the next line starts below it
    if (enabled_ && shown_) std::fputs("\n", out_), std::fflush(out_);
    shown_ = false;
    active_ = false;
  }
}

void ProgressBar::Tick() {
  if (active_ && !what_.empty()) Draw();
}

void ProgressBar::Print(const std::string& line) {
  Clear();
  std::fprintf(out_, "%s\n", line.c_str());
  if (active_) Draw();
  std::fflush(out_);
}

void ProgressBar::Draw() {
  if (!enabled_ || !active_) return;
  const double secs = clock_->SecondsSince(since_);
  std::fprintf(out_, "\r\033[K%s", Render(round_, max_, done_, total_, what_, secs).c_str());
  std::fflush(out_);
  shown_ = true;
}

void ProgressBar::Clear() {
  if (!enabled_ || !shown_) return;
  std::fputs("\r\033[K", out_);
  std::fflush(out_);
  shown_ = false;
}

}  // namespace msaflow::report
