// Dynamic batching for a model served to many clients (msaflow serve's /v2 inference): requests
// wait in a bounded queue and one thread runs them together, up to `max_batch` images, then
// hands each request its rows. The first request waiting waits for company at most
// `max_delay_ms`, and only while other requests are on their way (Arrival): a lone client's
// request runs at once, and under load the requests that came while a batch ran form the next. A request that would overfill the queue is refused at once (kUnavailable), never
// held. The Classifier (whose executor is not thread-safe) is used by that thread only.
#pragma once

#include <atomic>
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

  // A request on its way (being read and prepared on its connection's thread): while one is, the
  // batch thread waits (up to max_delay_ms) for it; when none is, a lone request runs at once.
  // Hold the returned guard until Infer is called (or the request fails).
  class Arrival {
   public:
    explicit Arrival(Batcher* b) : b_(b) { b_->arriving_.fetch_add(1); }
    ~Arrival() { Done(); }
    Arrival(const Arrival&) = delete;
    Arrival& operator=(const Arrival&) = delete;
    void Done() {
      if (b_) b_->arriving_.fetch_sub(1);
      b_ = nullptr;
    }

   private:
    Batcher* b_;
  };
  // n prepared images (model().PreparedSize() floats each) -> n x classes probabilities.
  // Throws kUnavailable when the queue is full, or what classifying threw.
  std::vector<float> Infer(std::vector<float> prepared, int64_t n, Arrival* arrival = nullptr);

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
  std::atomic<int64_t> arriving_{0};
  bool stop_ = false;
  BatchStats stats_;
  std::thread thread_;
};

}  // namespace msaflow::inference
