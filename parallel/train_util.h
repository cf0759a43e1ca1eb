// Small pieces the training modes share; the straggler's sleep also serves the evaluate step.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "parallel/train.h"

namespace msaflow::parallel {

// Seconds since it was made: a training mode's own wall time (a measurement, not a wait: see
// common/clock.h).
struct Stopwatch {
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  double Seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
};

// The seed of a batch stream: stream 0 is sync's (the whole set), 1 + k a worker's or group's.
inline uint64_t ShuffleSeed(uint64_t seed, uint64_t stream) { return seed * 0x9E3779B97F4A7C15ULL + stream + 1; }

// Rows gathered into one contiguous batch, reused for every step.
struct BatchBuffer {
  std::vector<float> x;
  std::vector<uint8_t> y;
  BatchBuffer(int64_t rows, int64_t dim) : x(static_cast<size_t>(rows * dim)), y(static_cast<size_t>(rows)) {}
  void Gather(const TrainData& d, const int64_t* rows, int64_t count, int64_t dim) {
    for (int64_t i = 0; i < count; ++i) {
      d.Row(rows[i], dim, &x[static_cast<size_t>(i * dim)]);
      y[static_cast<size_t>(i)] = d.y[rows[i]];
    }
  }
};

// Tail averaging: the trained weights are the mean of the iterates of the last epoch's updates
// (when there are 2 epochs or more), which takes most of the step-to-step noise out of the
// final model — and, under async, most of the run-to-run noise of arrival order.
class TailAverage {
 public:
  TailAverage(int64_t total_updates, int64_t per_epoch, int64_t epochs)
      : from_(epochs >= 2 ? total_updates - per_epoch : total_updates) {}
  // Called after update number `update` (1-based) with the weights it produced.
  void Add(int64_t update, const float* w, size_t n) {
    if (update <= from_) return;
    if (sum_.empty()) sum_.assign(n, 0.0);
    for (size_t i = 0; i < n; ++i) sum_[i] += w[i];
    ++count_;
  }
  // Replaces w with the average, if any update was averaged.
  void Finish(float* w, size_t n) const {
    if (!count_) return;
    for (size_t i = 0; i < n; ++i) w[i] = static_cast<float>(sum_[i] / static_cast<double>(count_));
  }

 private:
  int64_t from_, count_ = 0;
  std::vector<double> sum_;
};

// What parameter servers train (parallel/train_ps.cc): P floats, a head's parameters and, when
// fine-tuning, a tail's weights after them; and how a worker computes a gradient of them.
struct PsModel {
  kernels::Head* h = nullptr;  // its config (batch, epochs, optimiser); server 0 adds its curve
  int64_t n = 0;               // training rows
  float* params = nullptr;     // P floats: this rank's copy, which the servers' replies refresh
  size_t P = 0;
  size_t head_size = 0;      // params [0, head_size) are the head's; the rest train at
  double tail_lr_scale = 1;  // the head's learning rate x tail_lr_scale, one block, no L2
  // The batch-mean share (1 / batch) of the gradient of `count` rows of a batch of `batch` at
  // the current params into grad (P floats, zeroed); returns the rows' summed loss.
  std::function<double(const int64_t* rows, int64_t count, int64_t batch, float* grad, int64_t* correct)> gradient;
  // How a worker orders its shard for each pass over it (empty: std::shuffle), and whom it tells
  // the rows it will pass to `gradient`, a pass ahead (may be empty): a fine-tuning's streamed maps.
  std::function<void(std::vector<int64_t>& rows, std::mt19937_64& rng)> shuffle;
  std::function<void(const int64_t* rows, int64_t count)> expect;
};

// A fine-tuned tail's optimiser settings: the head's algorithm at the head's learning rate x
// `scale`, without L2 (sync's and the parameter servers' alike).
inline kernels::HeadConfig TailConfig(const kernels::HeadConfig& head, double scale) {
  kernels::HeadConfig cfg = head;
  cfg.lr = head.lr * scale;
  cfg.l2 = 0;
  return cfg;
}

// Async (opt.groups 0) or hybrid over `world`; on return rank 0 holds the trained params.
TrainStats TrainWithServers(Comm& world, PsModel& m, const PsOptions& opt);

// The straggler's sleep: factor - 1 times the time since `since`.
inline void Straggle(std::chrono::steady_clock::time_point since, double factor) {
  auto took = std::chrono::steady_clock::now() - since;
  std::this_thread::sleep_for(std::chrono::duration_cast<std::chrono::nanoseconds>(took * (factor - 1)));
}

}  // namespace msaflow::parallel
