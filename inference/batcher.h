// Dynamic batching for a model served to many clients (msaflow serve's /v2 inference): requests
// wait in a bounded queue and one thread runs them together, up to `max_batch` images or
// `max_delay_ms` after the first one waiting, whichever comes first, then hands each request
// its rows. A request that would overfill the queue is refused at once (kUnavailable), never
// held. The Classifier (whose executor is not thread-safe) is used by that thread only.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "inference/predict.h"

namespace msaflow::inference {

struct BatchOptions {
  int64_t max_batch = 64;     // images run together
  double max_delay_ms = 2;    // how long the first waiting request waits for company
  int64_t max_queue = 1024;   // images waiting at most; beyond, requests are refused
};

struct BatchStats {
  int64_t requests = 0, images = 0, batches = 0, refused = 0;
};

class Batcher {
 public:
  Batcher(std::unique_ptr<Classifier> model, BatchOptions o);
  ~Batcher();  // refuses what still waits, then joins
  Batcher(const Batcher&) = delete;
  Batcher& operator=(const Batcher&) = delete;

  // n prepared images (model().PreparedSize() floats each) -> n x classes probabilities.
  // Throws kUnavailable when the queue is full, or what classifying threw.
  std::vector<float> Infer(std::vector<float> prepared, int64_t n);

  const Classifier& model() const { return *model_; }
  BatchStats stats() const;

 private:
  struct Job {
    std::vector<float> x;
    int64_t n = 0;
    std::promise<std::vector<float>> done;
  };
  void Loop();

  std::unique_ptr<Classifier> model_;
  BatchOptions o_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::unique_ptr<Job>> queue_;
  int64_t queued_images_ = 0;
  bool stop_ = false;
  BatchStats stats_;
  std::thread thread_;
};

}  // namespace msaflow::inference
