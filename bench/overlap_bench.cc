// bench/overlap: the data manager (common/overlap.h) reading features parts from the NAM
// while a head computes on the previous part, against reading and computing in turn, in the
// same run. The computation per part is the evaluate step's (a softmax head's logits over the
// part's rows), sized to take as long as reading the part (more passes, or fewer rows):
// "transfer time ≈ compute time", where double buffering can at best halve the time. Goal: >= 1.6x (the Blue Waters
// study's gain from overlapping transfers with computation).
//
//   bench_overlap --msaflow build/msaflow [--parts 32] [--reps 42] [--check]
//
// On a shared VM one run of a NAM path varies by up to 2x from the next, so the comparisons are
// paired: each repetition runs the three ways back to back, and the goals are judged on the
// median over repetitions of their ratios, printed with the range that holds the true median
// with ~95 % confidence (order statistics). --reps 42 goes through the six orders of the three
// ways seven times.
//
// Three NAMs: the NAM server over tcp;ofi_rxm with RMA (both sides need a core to move the
// bytes), the same server's memory pool mapped into the client (the fetch is a copy and a
// checksum on the helper thread), and a simulated remote link (mem:// behind a fixed delay per
// read, the client's CPU idle meanwhile, as for a NAM across the fabric).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "common/error.h"
#include "common/files.h"
#include "common/overlap.h"
#include "kernels/head.h"
#include "kernels/metrics.h"
#include "nam/fabric_store.h"
#include "nam/fault_store.h"
#include "nam/pool.h"

namespace {

using namespace msaflow;
using Steady = std::chrono::steady_clock;

constexpr int64_t kRows = 448, kDim = 576, kClasses = 10;

double Since(Steady::time_point t0) { return std::chrono::duration<double>(Steady::now() - t0).count(); }

struct Workload {
  nam::Store* store;
  int64_t parts;
  const kernels::Head* head;
  int repeat = 1;       // head passes per part
  int64_t rows = kRows;  // ... over this many of its rows
  std::vector<uint8_t> labels = std::vector<uint8_t>(kRows);

  // Seconds for one pass over every part, read as `choice` says; `correct` counts the
  // predictions (a check).
  double Run(OverlapChoice& choice, int64_t* correct) {
    std::string buf[2];
    *correct = 0;
    auto t0 = Steady::now();
    Overlap(
        parts, [&](int64_t p) { store->GetInto("features/bench.p" + std::to_string(p), buf[p % 2]); },
        [&](int64_t p) {
          const auto* x = reinterpret_cast<const float*>(buf[p % 2].data());
          for (int r = 0; r < repeat; ++r) {
            auto logits = head->Logits(x, rows);
            if (r == 0) *correct += kernels::Evaluate(logits.data(), labels.data(), rows, kClasses).correct;
          }
        },
        choice);
    return Since(t0);
  }
};

// The median of paired ratios, and the order statistics around it that cover the true median
// with ~95 % confidence (the binomial's normal approximation: n/2 -+ 0.98 sqrt(n)).
struct Ratio {
  double median = 0, lo = 0, hi = 0;
};

Ratio PairedRatio(const std::vector<double>& num, const std::vector<double>& den) {
  std::vector<double> r;
  for (size_t i = 0; i < num.size() && i < den.size(); ++i) r.push_back(num[i] / den[i]);
  std::sort(r.begin(), r.end());
  const double n = static_cast<double>(r.size());
  const auto at = [&](double k) { return r[static_cast<size_t>(std::clamp(k, 0.0, n - 1))]; };
  const double half = 0.98 * std::sqrt(n);
  return {bench::Median(r), at(std::floor(n / 2 - half)), at(std::ceil(n / 2 + half) - 1)};
}

struct Row {
  std::string what;
  double read_ms, compute_ms, serial_s, overlapped_s, chosen_s;
  Ratio overlap_gain, chosen_gain;  // serial / overlapped, serial / chosen, paired by repetition
  std::string chosen;  // what the data manager chose (auto), and why
  std::string tally;   // how often it chose each way over the repetitions
};

Row Measure(const std::string& what, nam::Store& store, const kernels::Head& head, int64_t parts, int reps) {
  Workload w{&store, parts, &head};
  // The transfer per part alone, and the head per part alone.
  std::string buf;
  std::vector<double> reads, heads;
  for (int i = 0; i < 3; ++i) {
    auto t0 = Steady::now();
    for (int64_t p = 0; p < parts; ++p) store.GetInto("features/bench.p" + std::to_string(p), buf);
    reads.push_back(Since(t0) / static_cast<double>(parts));
    const auto* x = reinterpret_cast<const float*>(buf.data());
    t0 = Steady::now();
    for (int k = 0; k < 5; ++k) head.Logits(x, kRows);
    heads.push_back(Since(t0) / 5);
  }
  const double read_s = bench::Median(reads), head_s = bench::Median(heads);
  // As much of the head's work as reading a part takes: whole passes, or part of the rows.
  const double f = read_s / head_s;
  w.repeat = std::max(1, static_cast<int>(std::lround(f)));
  if (f < 1) w.rows = std::max<int64_t>(16, static_cast<int64_t>(f * kRows));
  std::vector<double> serial, overlapped, chosen;
  std::string choice_said;
  std::map<std::string, int> choices;  // each repetition's fresh choice
  int64_t c1 = 0, c2 = 0, c3 = 0;
  for (int i = 0; i < reps; ++i) {  // interleaved, so drifts in the machine's load hit all three
    OverlapChoice in_turn(OverlapMode::kOff), ahead(OverlapMode::kOn), automatic(OverlapMode::kAuto);
    // The order goes through the six permutations in turn: each way runs right after each other
    // way equally often (the NAM server's threads, the helper thread, the caches and the clock
    // speed carry over from one run to the next; a rotation ran the chosen way after the
    // overlapped one in two repetitions of three, and in turn after it in one).
    static constexpr int kOrders[6][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
    for (int k = 0; k < 3; ++k) {
      switch (kOrders[i % 6][k]) {
        case 0: serial.push_back(w.Run(in_turn, &c1)); break;
        case 1: overlapped.push_back(w.Run(ahead, &c2)); break;
        default: chosen.push_back(w.Run(automatic, &c3)); break;  // a fresh choice: its probing paid every rep
      }
    }
    if (c1 != c2 || c1 != c3) Throw(ErrorKind::kInternal, what + ": the three runs predicted differently");
    if (i == 0) choice_said = automatic.Describe();
    ++choices[automatic.chosen()];
  }
  std::string tally;
  for (const auto& [way, count] : choices) tally += (tally.empty() ? "" : ", ") + way + " " + std::to_string(count);
  const double compute_s = head_s * w.repeat * static_cast<double>(w.rows) / kRows;
  return {what,
          1e3 * read_s,
          1e3 * compute_s,
          bench::Median(serial),
          bench::Median(overlapped),
          bench::Median(chosen),
          PairedRatio(serial, overlapped),
          PairedRatio(serial, chosen),
          choice_said,
          tally};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench/overlap: NAM reads overlapped with computation vs in turn"};
  std::string exe = "build/msaflow";
  int64_t parts = 32;
  int reps = 42;
  bool check = false;
  app.add_option("--msaflow", exe, "the msaflow binary (starts the NAM server)")->capture_default_str();
  app.add_option("--parts", parts, "features parts of 448 x 576 float32 (~1 MiB)")->capture_default_str();
  app.add_option("--reps", reps, "interleaved repetitions (median reported)")->capture_default_str();
  app.add_flag("--check", check, "exit 1 if the goal is missed");
  CLI11_PARSE(app, argc, argv);
  try {
    std::string dir = std::filesystem::temp_directory_path() / ("msaflow-bench-overlap-" + std::to_string(getpid()));
    MakeDirs(dir);
    // Features and a trained-looking head (random weights; the arithmetic is what counts).
    std::mt19937 rng(7);
    std::normal_distribution<float> g(0.f, 1.f);
    std::vector<std::string> payload(static_cast<size_t>(parts));
    for (auto& p : payload) {
      std::vector<float> x(static_cast<size_t>(kRows * kDim));
      for (auto& v : x) v = g(rng);
      p.assign(reinterpret_cast<const char*>(x.data()), x.size() * sizeof(float));
    }
    kernels::HeadConfig cfg;
    cfg.type = "softmax";
    kernels::Head head;
    head.config = cfg;
    head.in_dim = kDim;
    head.classes = kClasses;
    head.mean.assign(kDim, 0.f);
    head.inv_std.assign(kDim, 1.f);
    head.params.resize(static_cast<size_t>(kDim * kClasses + kClasses));
    for (auto& v : head.params) v = 0.05f * g(rng);

    std::printf("%s\n", bench::CpuLine().c_str());
    std::printf("bench/overlap: %lld parts of %lld x %lld float32 (%.2f MiB each), median of %d, on %u cores\n",
                static_cast<long long>(parts), static_cast<long long>(kRows), static_cast<long long>(kDim),
                static_cast<double>(payload[0].size()) / (1 << 20), reps, std::thread::hardware_concurrency());
    std::vector<Row> rows;
    int port = 19000 + static_cast<int>(getpid() % 20000);
    for (const std::string transport : {"rma", "map"}) {
      bench::Child server;
      std::string ready = dir + "/ready-" + transport + ".json", log = dir + "/server-" + transport + ".log";
      server.Start({exe, "nam", "serve", "--listen", "127.0.0.1:" + std::to_string(port++), "--provider", "tcp",
                    "--capacity", std::to_string(payload[0].size() * static_cast<size_t>(parts) * 2 + (64 << 20)),
                    "--ready-file", ready},
                   log);
      std::string uri = bench::WaitReady(ready, server, log);
      uri += (uri.find('?') == std::string::npos ? "?" : "&") + std::string("transport=") + transport;
      nam::FabricStore store(uri);
      for (int64_t p = 0; p < parts; ++p) store.Put("features/bench.p" + std::to_string(p), payload[static_cast<size_t>(p)], {});
      rows.push_back(Measure(transport == "rma" ? "NAM server, tcp RMA" : "NAM server, mapped pool", store, head,
                             parts, reps));
    }
    // A remote NAM: each read waits 2 ms on the link (1 MiB at ~0.5 GB/s), the CPU free meanwhile.
    auto inner = nam::OpenStore("mem://bench-overlap");
    for (int64_t p = 0; p < parts; ++p) inner->Put("features/bench.p" + std::to_string(p), payload[static_cast<size_t>(p)], {});
    nam::FaultStore link(std::move(inner), nam::ParseFaultRules(
                                               R"([{"op": "get", "action": "delay", "delay_ms": 2, "count": 0}])", "bench"));
    rows.push_back(Measure("simulated remote link", link, head, parts, reps));

    std::printf("\n  medians of %d repetitions; speed-ups are medians of the ratios paired by repetition, [95 %% range]\n",
                reps);
    std::printf("  %-26s %10s %12s %10s %12s %20s %10s %20s\n", "NAM", "read/part", "compute/part", "serial",
                "overlapped", "speed-up", "chosen", "vs serial");
    for (const auto& r : rows)
      std::printf("  %-26s %7.2f ms %9.2f ms %8.3f s %10.3f s %6.2fx [%.2f, %.2f] %8.3f s %6.2fx [%.2f, %.2f]\n",
                  r.what.c_str(), r.read_ms, r.compute_ms, r.serial_s, r.overlapped_s, r.overlap_gain.median,
                  r.overlap_gain.lo, r.overlap_gain.hi, r.chosen_s, r.chosen_gain.median, r.chosen_gain.lo,
                  r.chosen_gain.hi);
    std::printf("\n  the data manager's choice (auto; why: the first repetition's):\n");
    for (const auto& r : rows)
      std::printf("    %s: %s of %d repetitions; %s\n", r.what.c_str(), r.tally.c_str(), reps, r.chosen.c_str());
    // Goals (issue 32): the chosen mode never more than 3 % slower than reading in turn, and
    // >= 1.6x where overlapping pays (the simulated remote link: transfer ~ compute, CPU idle).
    bool met = true;
    for (const auto& r : rows) {
      const double vs = r.chosen_gain.median;
      const bool pays = r.overlap_gain.median >= 1.6;
      const bool ok = vs >= 0.97 && (!pays || vs >= 1.6);
      met = met && ok;
      std::printf("  goal %-26s chosen %.2fx of serial (>= 0.97%s): %s\n", r.what.c_str(), vs,
                  pays ? ", and >= 1.6 as overlapping pays here" : "", ok ? "met" : "MISSED");
    }
    const bool remote_pays = rows.back().overlap_gain.median >= 1.6;
    std::printf("  goal: overlapping >= 1.6x behind the remote link: %.2fx, %s\n", rows.back().overlap_gain.median,
                remote_pays ? "met" : "MISSED");
    met = met && remote_pays;
    std::filesystem::remove_all(dir);
    return check && !met ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_overlap: error: %s\n", e.what());
    return 1;
  }
}
