#include "common/overlap.h"

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "common/error.h"

namespace msaflow {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// One helper thread per calling thread, started on first use and kept: starting a thread
// costs ~2 ms on some virtual machines (more than a fetch), waking a parked one microseconds.
class Helper {
 public:
  Helper() : thread_([this] { Loop(); }) {}
  ~Helper() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  void Submit(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> l(mu_);
      job_ = std::move(job);
      pending_ = true;
      done_ = false;
      error_ = nullptr;
    }
    wake_.notify_all();
  }
  // Waits for the job submitted last; rethrows its exception.
  void Wait() {
    std::unique_lock<std::mutex> l(mu_);
    finished_.wait(l, [&] { return done_; });
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> l(mu_);
    for (;;) {
      wake_.wait(l, [&] { return stop_ || pending_; });
      if (stop_) return;
      std::function<void()> job = std::move(job_);
      pending_ = false;
      l.unlock();
      std::exception_ptr error;
      try {
        job();
      } catch (...) {
        error = std::current_exception();
      }
      l.lock();
      error_ = error;
      done_ = true;
      finished_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable wake_, finished_;
  std::function<void()> job_;
  bool pending_ = false, done_ = true, stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // last: started once the members above exist
};

Helper& ThisThreadsHelper() {
  thread_local std::unique_ptr<Helper> helper;
  if (!helper) helper = std::make_unique<Helper>();
  return *helper;
}

}  // namespace

OverlapStats Overlap(int64_t n, const std::function<void(int64_t)>& fetch,
                     const std::function<void(int64_t)>& consume, bool on) {
  OverlapStats s;
  if (!on || n <= 1) {
    for (int64_t i = 0; i < n; ++i) {
      auto t0 = Clock::now();
      fetch(i);
      const double f = Since(t0);
      s.fetch_s += f;
      s.wait_s += f;
      t0 = Clock::now();
      consume(i);
      s.consume_s += Since(t0);
      ++s.items;
    }
    return s;
  }
  Helper& helper = ThisThreadsHelper();
  double next_fetch_s = 0;  // written by the helper, read after Wait()
  {
    auto t0 = Clock::now();
    fetch(0);
    const double f = Since(t0);
    s.fetch_s += f;
    s.wait_s += f;
  }
  for (int64_t i = 0; i < n; ++i) {
    const bool ahead = i + 1 < n;
    if (ahead)
      helper.Submit([&fetch, &next_fetch_s, i] {
        auto t0 = Clock::now();
        fetch(i + 1);
        next_fetch_s = Since(t0);
      });
    auto t0 = Clock::now();
    try {
      consume(i);
    } catch (...) {
      if (ahead) {  // the fetch writes into the caller's buffers: let it finish first
        try {
          helper.Wait();
        } catch (...) {
        }
      }
      throw;
    }
    s.consume_s += Since(t0);
    ++s.items;
    if (ahead) {
      auto w0 = Clock::now();
      helper.Wait();  // rethrows the fetch's error
      s.wait_s += Since(w0);
      s.fetch_s += next_fetch_s;
    }
  }
  return s;
}

bool OverlapEnabled() {
  const char* v = std::getenv("MSAFLOW_OVERLAP");
  if (!v || !*v) return true;
  std::string s(v);
  if (s == "1") return true;
  if (s == "0") return false;
  Throw(ErrorKind::kInvalidInput, "MSAFLOW_OVERLAP='" + s + "': expected 0 (off) or 1 (on)");
}

}  // namespace msaflow
