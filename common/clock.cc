#include "common/clock.h"

#include <time.h>

namespace msaflow {
namespace {

class RealClock : public Clock {
 public:
  TimePoint Now() override { return std::chrono::steady_clock::now(); }
  void Sleep(Duration d) override {
    if (d <= Duration::zero()) return;
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
    timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
    ::nanosleep(&ts, nullptr);  // EINTR: a signal arrived; the caller's loop looks at it
  }
};

}  // namespace

Clock& SystemClock() {
  static RealClock clock;
  return clock;
}

Clock::TimePoint ManualClock::Now() {
  std::lock_guard<std::mutex> l(mu_);
  return now_;
}

void ManualClock::Sleep(Duration d) {
  std::lock_guard<std::mutex> l(mu_);
  if (d <= Duration::zero()) return;
  now_ += d;
  slept_ += d;
}

void ManualClock::Advance(Duration d) {
  std::lock_guard<std::mutex> l(mu_);
  now_ += d;
}

Clock::Duration ManualClock::slept() {
  std::lock_guard<std::mutex> l(mu_);
  return slept_;
}

}  // namespace msaflow
