// Time as msaflow's waits see it: a monotonic now and a sleep, behind one interface so that
// what a test may want to control can be driven by a test's ManualClock (no real waiting, exact
// durations) and by SystemClock everywhere else: the run driver, the launchers, the progress
// bar, the NAM server process and the NAM server's sessions' leases, a child process's wait,
// the service's request deadlines and event streams. Waits on a condition variable (the
// registry's tick, the batcher's delay) stay on std::chrono: they must wake when notified.
// Wall-clock timestamps (the journal's "time") are not this clock's business.
#pragma once

#include <chrono>
#include <mutex>

namespace msaflow {

class Clock {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  using Duration = std::chrono::steady_clock::duration;
  virtual ~Clock() = default;
  virtual TimePoint Now() = 0;
  // Returns early when a signal arrives (the real clock's nanosleep is interrupted), so a
  // waiting loop sees an interrupt at once.
  virtual void Sleep(Duration d) = 0;
  void SleepSeconds(double s) { Sleep(std::chrono::duration_cast<Duration>(std::chrono::duration<double>(s))); }
  double SecondsSince(TimePoint t) { return std::chrono::duration<double>(Now() - t).count(); }
  // Now, in seconds on this clock's own scale: for differences only.
  double NowSeconds() { return SecondsSince(TimePoint{}); }
};

// std::chrono::steady_clock and a real sleep.
Clock& SystemClock();

// Measuring how long work took (not a wait a test may want to control: those take a Clock).
using SteadyClock = std::chrono::steady_clock;
inline double SecondsSince(SteadyClock::time_point t0) {
  return std::chrono::duration<double>(SteadyClock::now() - t0).count();
}

// A clock that moves only when told: Sleep advances it by the duration asked (and returns at
// once), Advance by hand. Thread-safe.
class ManualClock : public Clock {
 public:
  TimePoint Now() override;
  void Sleep(Duration d) override;
  void Advance(Duration d);
  void AdvanceSeconds(double s) { Advance(std::chrono::duration_cast<Duration>(std::chrono::duration<double>(s))); }
  // The total time slept through Sleep (what a real clock would have waited).
  Duration slept();

 private:
  std::mutex mu_;
  TimePoint now_{};
  Duration slept_{};
};

}  // namespace msaflow
