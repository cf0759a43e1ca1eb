#include "inference/batcher.h"

#include <algorithm>
#include <chrono>

#include "common/error.h"

namespace msaflow::inference {

Batcher::Batcher(std::unique_ptr<Classifier> model, BatchOptions o) : model_(std::move(model)), o_(o) {
  o_.max_batch = std::max<int64_t>(1, o_.max_batch);
  o_.max_queue = std::max(o_.max_queue, o_.max_batch);
  model_->set_pow2_batches(true);
  thread_ = std::thread([this] { Loop(); });
}

Batcher::~Batcher() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

BatchStats Batcher::stats() const {
  std::lock_guard<std::mutex> l(mu_);
  return stats_;
}

std::vector<float> Batcher::Infer(std::vector<float> prepared, int64_t n, Arrival* arrival) {
  if (n < 1) return {};
  if (static_cast<int64_t>(prepared.size()) != n * model_->PreparedSize())
    Throw(ErrorKind::kInvalidInput, "infer: " + std::to_string(prepared.size()) + " values for " + std::to_string(n) +
                                        " images of " + std::to_string(model_->PreparedSize()));
  auto job = std::make_unique<Job>();
  job->x = std::move(prepared);
  job->n = n;
  std::future<std::vector<float>> result = job->done.get_future();
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stop_ || (queued_images_ > 0 && queued_images_ + n > o_.max_queue) || n > o_.max_queue) {
      ++stats_.refused;
      Throw(ErrorKind::kUnavailable, "the model's queue is full (" + std::to_string(queued_images_) + " images wait, at most " +
                                         std::to_string(o_.max_queue) + "); try again");
    }
    queued_images_ += n;
    queue_.push_back(std::move(job));
    if (arrival) arrival->Done();  // counted as queued now, under the lock the batch thread waits with
  }
  wake_.notify_all();
  return result.get();
}

void Batcher::Loop() {
  const int64_t per = model_->PreparedSize(), k = model_->classes();
  std::vector<float> batch;
  // Every batch size's plan compiled before the first request: no request pays for one, and
  // the memory they take is taken now, not when load first makes a full batch.
  try {
    for (int64_t b = 1; b <= std::min<int64_t>(o_.max_batch, 64); b *= 2) {
      batch.assign(static_cast<size_t>(b * per), 0.f);
      model_->ClassifyPrepared(batch.data(), b);
    }
  } catch (const Error&) {
    // a model that cannot run zeros fails each request with its own message instead
  }
  for (;;) {
    std::vector<std::unique_ptr<Job>> jobs;
    {
      std::unique_lock<std::mutex> l(mu_);
      wake_.wait(l, [&] { return stop_ || !queue_.empty(); });
      if (stop_) {
        for (auto& j : queue_)
          j->done.set_exception(std::make_exception_ptr(Error(ErrorKind::kUnavailable, "the service is stopping")));
        queue_.clear();
        return;
      }
      // Company for the first request: while others are on their way, until the batch is full
      // or the delay is over.
      const auto deadline =
          std::chrono::steady_clock::now() + std::chrono::duration<double, std::milli>(o_.max_delay_ms);
      wake_.wait_until(l, deadline,
                       [&] { return stop_ || queued_images_ >= o_.max_batch || arriving_.load() == 0; });
      int64_t images = 0;
      while (!queue_.empty() && (jobs.empty() || images + queue_.front()->n <= o_.max_batch)) {
        images += queue_.front()->n;
        queued_images_ -= queue_.front()->n;
        jobs.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      stats_.batches += 1;
      stats_.requests += static_cast<int64_t>(jobs.size());
      stats_.images += images;
    }
    int64_t n = 0;
    for (const auto& j : jobs) n += j->n;
    try {
      const float* x = jobs.front()->x.data();
      if (jobs.size() > 1) {  // one contiguous batch
        batch.resize(static_cast<size_t>(n * per));
        size_t at = 0;
        for (const auto& j : jobs) {
          std::copy(j->x.begin(), j->x.end(), batch.begin() + static_cast<std::ptrdiff_t>(at));
          at += j->x.size();
        }
        x = batch.data();
      }
      const std::vector<float> p = model_->ClassifyPrepared(x, n);
      int64_t row = 0;
      for (auto& j : jobs) {
        j->done.set_value(std::vector<float>(p.begin() + row * k, p.begin() + (row + j->n) * k));
        row += j->n;
      }
    } catch (...) {
      for (auto& j : jobs) j->done.set_exception(std::current_exception());
    }
  }
}

}  // namespace msaflow::inference
