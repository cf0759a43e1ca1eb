// Double buffering: fetch item i+1 (a NAM read, a file read, preparing a batch) on a helper
// thread while item i is consumed (computed on) on the caller's thread. The data manager of the
// prepare, train and evaluate steps; docs/parallel.md measures what it hides.
//
// Overlap(n, fetch, consume, on) calls fetch(0..n-1) and consume(0..n-1), each in order, with
// fetch(i+1) running while consume(i) runs. The caller keeps two buffers (item i in buffer
// i % 2): fetch(i+2) starts only after consume(i) has returned. With on == false every
// fetch runs on the caller's thread right before its consume, for comparison.
// An exception from either side is rethrown on the caller's thread after any fetch in flight
// has finished, so no helper outlives the caller's buffers.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace msaflow {

struct OverlapStats {
  int64_t items = 0;
  double fetch_s = 0;    // time spent fetching (on whichever thread)
  double consume_s = 0;  // time spent consuming
  double wait_s = 0;     // time the caller waited for a fetch: the transfer time not hidden
  void Add(const OverlapStats& o) {
    items += o.items;
    fetch_s += o.fetch_s;
    consume_s += o.consume_s;
    wait_s += o.wait_s;
  }
};

// A thread that runs one job at a time in the background: Submit a job, do other work, Wait
// for it (which rethrows its exception). Keep one rather than start a thread per job:
// starting a thread costs ~2 ms on some virtual machines (more than a fetch), waking a parked
// one microseconds. The destructor waits for the job in flight.
class Worker {
 public:
  Worker();
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;
  // Runs `job` on the worker; the previous job must have been waited for.
  void Submit(std::function<void()> job);
  // Waits for the job submitted last (at once if none); rethrows its exception.
  void Wait();

 private:
  void Loop();
  std::mutex mu_;
  std::condition_variable wake_, finished_;
  std::function<void()> job_;
  bool pending_ = false, done_ = true, stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // last: started once the members above exist
};

OverlapStats Overlap(int64_t n, const std::function<void(int64_t)>& fetch,
                     const std::function<void(int64_t)>& consume, bool on);

// MSAFLOW_OVERLAP=0 switches overlapping off in every step (default on); anything but 0 or 1
// is refused with kInvalidInput.
bool OverlapEnabled();

}  // namespace msaflow
