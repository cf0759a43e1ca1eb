#include "common/overlap.h"

#include <fmt/core.h>
#include <sched.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "common/clock.h"
#include "common/error.h"

namespace msaflow {
namespace {

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

namespace {

// Seconds this thread wanted a CPU: ran on one (its CPU clock, exact to the call), or waited in a
// run queue for one (a fetch that costs CPU on a busy node waits there, not on I/O: the
// scheduler's run delay, where the kernel keeps statistics). Not the scheduler's run time from
// the same file: for a running thread it lags by up to a tick (4 ms), more than a fetch takes.
double ThreadCpuDemand() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  double demand = static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
  static std::atomic<bool> schedstat{true};  // until a read shows the kernel keeps none
  if (schedstat.load(std::memory_order_relaxed)) {
    if (FILE* f = std::fopen("/proc/thread-self/schedstat", "r")) {
      unsigned long long run = 0, queued = 0;
      const int got = std::fscanf(f, "%llu %llu", &run, &queued);
      std::fclose(f);
      if (got == 2 && run > 0) return demand + 1e-9 * static_cast<double>(queued);
    }
    schedstat.store(false, std::memory_order_relaxed);  // 0 or unreadable: statistics off
  }
  return demand;
}

// CPU seconds of the whole process (every thread).
double ProcessCpu() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// The CPUs the calling thread may run on.
int ThreadCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, CPU_COUNT(&set));
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

constexpr double kInMemory = 20e-6;  // a fetch this short found its item already read

}  // namespace

void OverlapChoice::Decide(Phase to, std::string why) {
  phase_ = to;
  why_ = std::move(why);
}

void OverlapChoice::AddFetch(double fetch_s, double fetch_cpu_s) {
  ++fetches_;
  fetch_s_ += fetch_s;
  fetch_cpu_s_ += fetch_cpu_s;
}

void OverlapChoice::AddInTurn(double fetch_s, double consume_s, double consume_cpu_s) {
  in_turn_items_.push_back(fetch_s + consume_s);
  if (consume_cpu_s >= 0) {
    consume_s_ += consume_s;
    consume_cpu_s_ += consume_cpu_s;
  }
}

void OverlapChoice::SawOverlapped(double item_s, double fetch_s, double fetch_cpu_s) {
  ++items_;
  if (phase_ != Phase::kTrial || fetch_s < kInMemory) return;
  trial_items_.push_back(item_s);
  const bool confirming = in_turn_items_.empty();  // the first fetch waited: does it beside the computing?
  if (confirming) AddFetch(fetch_s, fetch_cpu_s);
  if (static_cast<int>(trial_items_.size()) < kProbe) return;
  if (!confirming) return DecideFromProbes();
  const double share = FetchShare();
  if (share < kWaits)
    Decide(Phase::kOverlapped, fmt::format("a fetch waits: {:.0f} % of its {:.2f} ms on a CPU, hidden behind the "
                                           "computing ({:.2f} ms an item)",
                                           100 * share, 1e3 * fetch_s_ / static_cast<double>(fetches_),
                                           1e3 * Median(trial_items_)));
  else
    phase_ = Phase::kProbe;  // it costs CPU after all: see whether reading in turn is faster
}

void OverlapChoice::SawFirstFetch(double fetch_s, double fetch_cpu_s) {
  if (phase_ != Phase::kFirst || fetch_s < kInMemory) return;
  if (fetch_cpu_s < 0 || fetch_cpu_s / fetch_s < kWaits) {
    phase_ = Phase::kTrial;  // it waits (or was not measured): fetch ahead and measure it there
    return;
  }
  AddFetch(fetch_s, fetch_cpu_s);
  share_in_turn_ = true;
  phase_ = Phase::kProbe;  // it costs CPU: read in turn and see what the computing leaves
}

void OverlapChoice::SawInTurn(double fetch_s, double consume_s, double consume_cpu_s) {
  ++items_;
  if (phase_ != Phase::kProbe || fetch_s < kInMemory) return;
  AddInTurn(fetch_s, consume_s, consume_cpu_s);
  if (static_cast<int>(in_turn_items_.size()) < kProbe) return;
  DecideFromProbes();
}

void OverlapChoice::DecideFromProbes() {
  cores_seen_ = cores_ > 0 ? cores_ : ThreadCores();
  // The process's CPU time over sub-millisecond consumes is coarse (other threads' time is added
  // as the kernel accounts it): more cores than there are reads as all of them.
  const double busy = consume_s_ > 0 ? std::min(consume_cpu_s_ / consume_s_, cores_seen_) : 0;
  const double share = FetchShare(), in_turn = Median(in_turn_items_);
  std::string figures = fmt::format("a fetch costs CPU ({:.0f} % of its {:.2f} ms on a CPU)", 100 * share,
                                    1e3 * fetch_s_ / static_cast<double>(std::max<int64_t>(1, fetches_)));
  const std::string cores = busy > 0 ? fmt::format("; the computing keeps {:.1f} of {:.0f} core(s) busy", busy, cores_seen_)
                                     : std::string();
  // What the fetch needs of a core beside the computing: all of its share measured in turn
  // (alone, above 100 % where it waited for a CPU meanwhile: a NAM server on the node moving the
  // bytes); measured beside the computing, a fetch that needs a CPU shows about half of it.
  const double need = share_in_turn_ ? share : 0.5 * share;
  if (busy > 0 && cores_seen_ - busy < need)
    return Decide(Phase::kInTurn, figures + fmt::format("; an item took {:.2f} ms in turn", 1e3 * in_turn) + cores +
                                      fmt::format(", and a fetch needs {:.0f} % of one: no core to spare", 100 * share));
  if (static_cast<int>(trial_items_.size()) < kProbe) {
    phase_ = Phase::kTrial;  // a core to spare: time the items fetched ahead too
    return;
  }
  const double overlapped = Median(trial_items_), gain = in_turn / overlapped;
  figures += fmt::format("; an item took {:.2f} ms overlapped, {:.2f} ms in turn ({:.2f}x)", 1e3 * overlapped,
                         1e3 * in_turn, gain);
  if (gain >= kGain)
    Decide(Phase::kOverlapped, figures + cores + ": there are cores to spare");
  else
    Decide(Phase::kInTurn, figures + cores +
                               fmt::format(": under {:.1f}x, the fetch and the computing compete for the same cores", kGain));
}

std::string OverlapChoice::chosen() const {
  switch (phase_) {
    case Phase::kOverlapped:
      return "overlapped";
    case Phase::kInTurn:
      return "in turn";
    case Phase::kFirst:
    case Phase::kProbe:
    case Phase::kTrial:
      break;
  }
  return "undecided";
}

std::string OverlapChoice::Describe() const {
  if (mode_ != OverlapMode::kAuto)
    return fmt::format("{} (MSAFLOW_OVERLAP={})", chosen(), mode_ == OverlapMode::kOn ? "1" : "0");
  if (!decided()) return fmt::format("undecided after {} item(s): too few fetches to measure", items_);
  return chosen() + ": " + why_;
}

nlohmann::json OverlapChoice::Json() const {
  nlohmann::json j = {{"mode", OverlapModeName(mode_)}, {"chosen", chosen()}, {"items", items_}};
  if (!why_.empty()) j["why"] = why_;
  if (fetches_ > 0) {
    j["fetch_ms"] = 1e3 * fetch_s_ / static_cast<double>(fetches_);
    j["fetch_cpu_share"] = FetchShare();
  }
  if (!trial_items_.empty()) j["overlapped_item_ms"] = 1e3 * Median(trial_items_);
  if (!in_turn_items_.empty()) j["in_turn_item_ms"] = 1e3 * Median(in_turn_items_);
  if (consume_s_ > 0) j["consume_cores_busy"] = consume_cpu_s_ / consume_s_;
  if (cores_seen_ > 0) j["cores"] = cores_seen_;
  return j;
}

OverlapStats Overlap(int64_t n, const std::function<void(int64_t)>& fetch,
                     const std::function<void(int64_t)>& consume, bool on) {
  OverlapChoice fixed(on ? OverlapMode::kOn : OverlapMode::kOff);
  return Overlap(n, fetch, consume, fixed);
}

OverlapStats Overlap(int64_t n, const std::function<void(int64_t)>& fetch,
                     const std::function<void(int64_t)>& consume, OverlapChoice& choice) {
  OverlapStats s;
  Worker* helper = nullptr;
  double next_fetch_s = 0, next_fetch_cpu_s = 0;  // written by the helper, read after Wait()
  bool fetched = false;                           // item i was fetched ahead
  for (int64_t i = 0; i < n; ++i) {
    double fetch_s = 0;
    if (!fetched) {
      const bool measure = choice.measuring_fetch();
      const double c0 = measure ? ThreadCpuDemand() : 0;
      const auto t0 = SteadyClock::now();
      fetch(i);
      fetch_s = SecondsSince(t0);
      if (measure) choice.SawFirstFetch(fetch_s, ThreadCpuDemand() - c0);
      s.fetch_s += fetch_s;
      s.wait_s += fetch_s;
    }
    const bool ahead = i + 1 < n && choice.ahead();
    // An item overlapped costs from handing the next fetch to the helper (waking a parked thread
    // on an idle virtual core took ~0.2 ms on the VMs measured: as long as a mapped-pool fetch)
    // to both ends; read in turn, its fetch and its consume.
    const auto item_t0 = SteadyClock::now();
    if (ahead) {
      if (!helper) helper = &ThisThreadsWorker();
      const bool measure = choice.measuring();  // reading the CPU figures costs microseconds: only while deciding
      helper->Submit([&fetch, &next_fetch_s, &next_fetch_cpu_s, i, measure] {
        const double c0 = measure ? ThreadCpuDemand() : 0;
        const auto t0 = SteadyClock::now();
        fetch(i + 1);
        next_fetch_s = SecondsSince(t0);
        next_fetch_cpu_s = measure ? ThreadCpuDemand() - c0 : 0;
      });
    }
    const bool measure_consume = !ahead && choice.measuring_consume();  // nothing else of ours runs meanwhile
    const double cpu0 = measure_consume ? ProcessCpu() : 0;
    const auto t0 = SteadyClock::now();
    try {
      consume(i);
    } catch (...) {
      if (ahead) {  // the fetch writes into the caller's buffers: let it finish first
        try {
          helper->Wait();
        } catch (...) {
        }
      }
      throw;
    }
    const double consume_s = SecondsSince(t0);
    const double consume_cpu_s = measure_consume ? ProcessCpu() - cpu0 : -1;
    s.consume_s += consume_s;
    ++s.items;
    if (ahead) {
      const auto w0 = SteadyClock::now();
      helper->Wait();  // rethrows the fetch's error
      s.wait_s += SecondsSince(w0);
      s.fetch_s += next_fetch_s;
      choice.SawOverlapped(SecondsSince(item_t0), next_fetch_s, next_fetch_cpu_s);
    } else {
      // Fetched ahead (the last item of this call): nothing beside it to measure.
      choice.SawInTurn(fetched ? 0 : fetch_s, consume_s, consume_cpu_s);
    }
    fetched = ahead;
  }
  return s;
}

OverlapMode OverlapModeFromEnv() {
  const char* v = std::getenv("MSAFLOW_OVERLAP");
  if (!v || !*v) return OverlapMode::kAuto;
  std::string s(v);
  if (s == "auto") return OverlapMode::kAuto;
  if (s == "1") return OverlapMode::kOn;
  if (s == "0") return OverlapMode::kOff;
  Throw(ErrorKind::kInvalidInput, "MSAFLOW_OVERLAP='" + s + "': expected 0 (in turn), 1 (overlapped) or auto");
}

const char* OverlapModeName(OverlapMode m) {
  switch (m) {
    case OverlapMode::kOff:
      return "off";
    case OverlapMode::kOn:
      return "on";
    case OverlapMode::kAuto:
      break;
  }
  return "auto";
}

}  // namespace msaflow
