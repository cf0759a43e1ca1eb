#include "common/overlap.h"

#include <chrono>
#include <cstdlib>
#include <future>
#include <string>

#include "common/error.h"

namespace msaflow {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace

OverlapStats Overlap(int64_t n, const std::function<void(int64_t)>& fetch,
                     const std::function<void(int64_t)>& consume, bool on) {
  OverlapStats s;
  auto timed_fetch = [&](int64_t i) {
    auto t0 = Clock::now();
    fetch(i);
    return Since(t0);
  };
  if (!on || n <= 1) {
    for (int64_t i = 0; i < n; ++i) {
      double f = timed_fetch(i);
      s.fetch_s += f;
      s.wait_s += f;
      auto t0 = Clock::now();
      consume(i);
      s.consume_s += Since(t0);
      ++s.items;
    }
    return s;
  }
  {
    auto t0 = Clock::now();
    s.fetch_s += timed_fetch(0);
    s.wait_s += Since(t0);
  }
  std::future<double> next;
  for (int64_t i = 0; i < n; ++i) {
    if (i + 1 < n) next = std::async(std::launch::async, timed_fetch, i + 1);
    auto t0 = Clock::now();
    try {
      consume(i);
    } catch (...) {
      if (next.valid()) next.wait();  // the fetch writes into the caller's buffers
      throw;
    }
    s.consume_s += Since(t0);
    ++s.items;
    if (next.valid()) {
      auto w0 = Clock::now();
      s.fetch_s += next.get();  // rethrows the fetch's error
      s.wait_s += Since(w0);
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
