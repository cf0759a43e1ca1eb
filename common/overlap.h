// Double buffering: fetch item i+1 (a NAM read, a file read, preparing a batch) on a helper
// thread while item i is consumed (computed on) on the caller's thread. The data manager of the
// prepare, train and evaluate steps; docs/parallel.md measures what it hides.
//
// Overlap(n, fetch, consume, choice) calls fetch(0..n-1) and consume(0..n-1), each in order,
// with fetch(i+1) running while consume(i) runs when that pays (OverlapChoice decides from
// what it measures; MSAFLOW_OVERLAP can force either way). The caller keeps two buffers (item
// i in buffer i % 2): fetch(i+2) starts only after consume(i) has returned. Read in turn,
// every fetch runs on the caller's thread right before its consume.
// An exception from either side is rethrown on the caller's thread after any fetch in flight
// has finished, so no helper outlives the caller's buffers.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

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

// How a stream of items is read: fetched in turn (off), always ahead (on), or auto: decided
// from the first items measured (OverlapChoice).
enum class OverlapMode { kOff, kOn, kAuto };

// The data manager's choice for one stream of items (a step's NAM reads of features, its image
// batches), kept across Overlap calls. In auto mode the stream's first fetch (read in turn: nothing
// can hide it) is measured: how long its thread wanted a CPU (ran, or waited in a run queue).
// A fetch that mostly waits (under kWaits of it on a CPU: a link, a disk) hides behind any
// computing: the next kProbe items are fetched ahead to confirm it (measured again, now beside the
// computing), and overlapping stays, at no cost. A fetch that costs CPU competes with the
// computing for the same cores (a NAM server on the node, a copy out of a mapped pool): the next
// items are read in turn, the process's CPU time over each consume saying how many cores the
// computing keeps busy. Where less than the fetch's share of a core is left over (the computing on
// every core, or the fetch waiting for a CPU even alone: a NAM server on the node moving the
// bytes), overlapping cannot gain: read in turn, having fetched nothing ahead.
// Where a core is to spare, kProbe items are fetched ahead too, and overlapping is kept only if
// an item took at least kGain times less that way (medians, so one item slowed by something
// else decides nothing). Fetches that found their item already in memory (under 20 µs) tell
// nothing and are not counted.
class OverlapChoice {
 public:
  static constexpr int kProbe = 3;
  static constexpr double kGain = 1.2;
  // A fetch ahead on a CPU less than this share of its time waits (on I/O). A fetch that needs
  // a CPU still shows about half while it shares one core with the computing.
  static constexpr double kWaits = 0.3;
  // `cores`: the cores the stream's process may use; 0: the calling thread's (its affinity),
  // looked up when deciding.
  explicit OverlapChoice(OverlapMode mode = OverlapMode::kAuto, int cores = 0) : mode_(mode), cores_(cores) {}
  // Whether the next item's fetch runs beside the current item's consume.
  bool ahead() const { return phase_ == Phase::kOverlapped || phase_ == Phase::kTrial; }
  // An item consumed while the next was fetched: from handing that fetch to the helper to the
  // end of both; the fetch's wall seconds and the seconds its thread wanted a CPU.
  void SawOverlapped(double item_s, double fetch_s, double fetch_cpu_s);
  // An item read in turn: its fetch's seconds (0: it was fetched ahead), its consume's, and the
  // process's CPU seconds over the consume (< 0: not measured).
  void SawInTurn(double fetch_s, double consume_s, double consume_cpu_s = -1);
  // The stream's first fetch, read in turn: its seconds and the seconds it wanted a CPU (< 0: not
  // measured). Decides, before its item is consumed, whether the next is fetched ahead.
  void SawFirstFetch(double fetch_s, double fetch_cpu_s);
  bool decided() const { return phase_ == Phase::kOverlapped || phase_ == Phase::kInTurn; }
  int64_t items() const { return items_; }
  // Whether the next fetch ahead is measured (its CPU demand too).
  bool measuring() const { return phase_ == Phase::kTrial; }
  // Whether the next fetch read in turn is measured (its CPU demand).
  bool measuring_fetch() const { return phase_ == Phase::kFirst; }
  // Whether the next consume read in turn is measured (the process's CPU time over it).
  bool measuring_consume() const { return phase_ == Phase::kProbe; }
  // "overlapped", "in turn", or "undecided" (too few items to measure: read in turn).
  std::string chosen() const;
  // One line for the step's log: the choice and the figures behind it.
  std::string Describe() const;
  // {mode, chosen, why, fetch_ms, fetch_cpu_share, in_turn_item_ms, overlapped_item_ms, consume_cores_busy,
  //  cores, items}
  nlohmann::json Json() const;

 private:
  // The first fetch in turn; then ahead (kTrial) or in turn (kProbe), maybe the other after; then decided.
  enum class Phase { kFirst, kTrial, kProbe, kOverlapped, kInTurn };
  void Decide(Phase to, std::string why);
  void AddFetch(double fetch_s, double fetch_cpu_s);
  void AddInTurn(double fetch_s, double consume_s, double consume_cpu_s);
  // Both ways timed, or the computing found to leave no core: overlapped or in turn.
  void DecideFromProbes();
  double FetchShare() const { return fetch_s_ > 0 ? fetch_cpu_s_ / fetch_s_ : 0; }
  OverlapMode mode_;
  int cores_;
  Phase phase_ = mode_ == OverlapMode::kOn ? Phase::kOverlapped
                 : mode_ == OverlapMode::kOff ? Phase::kInTurn
                                              : Phase::kFirst;
  int64_t items_ = 0;
  int64_t fetches_ = 0;  // measured for their CPU demand
  bool share_in_turn_ = false;  // measured read in turn (else beside the computing)
  double fetch_s_ = 0, fetch_cpu_s_ = 0, consume_s_ = 0, consume_cpu_s_ = 0;
  double cores_seen_ = 0;  // the cores counted when deciding
  std::vector<double> in_turn_items_, trial_items_;  // seconds per item, for the medians
  std::string why_;
};

// fetch(0..n-1) and consume(0..n-1), each in order; while `choice` says ahead, fetch(i+1) runs
// on the calling thread's helper while consume(i) runs. `choice` sees every item's timings.
OverlapStats Overlap(int64_t n, const std::function<void(int64_t)>& fetch,
                     const std::function<void(int64_t)>& consume, OverlapChoice& choice);
// The same with a fixed mode: overlapped (on) or in turn.
OverlapStats Overlap(int64_t n, const std::function<void(int64_t)>& fetch,
                     const std::function<void(int64_t)>& consume, bool on);

// MSAFLOW_OVERLAP: 0 reads in turn in every step, 1 always overlaps, auto (the default, also
// when unset) lets each stream choose; anything else is refused with kInvalidInput.
OverlapMode OverlapModeFromEnv();
// "off", "on", "auto".
const char* OverlapModeName(OverlapMode m);

}  // namespace msaflow
