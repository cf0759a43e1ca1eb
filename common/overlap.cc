#include "common/overlap.h"

#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>

#include "common/error.h"

namespace msaflow {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// One worker per calling thread for Overlap, started on first use and kept.
Worker& ThisThreadsWorker() {
  thread_local std::unique_ptr<Worker> worker;
  if (!worker) worker = std::make_unique<Worker>();
  return *worker;
}

}  // namespace

Worker::Worker() : thread_([this] { Loop(); }) {}

Worker::~Worker() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void Worker::Submit(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> l(mu_);
    job_ = std::move(job);
    pending_ = true;
    done_ = false;
    error_ = nullptr;
  }
  wake_.notify_all();
}

void Worker::Wait() {
  std::unique_lock<std::mutex> l(mu_);
  finished_.wait(l, [&] { return done_; });
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void Worker::Loop() {
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
  Worker& helper = ThisThreadsWorker();
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
