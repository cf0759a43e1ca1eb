#include "parallel/sync_batches.h"

#include <algorithm>
#include <numeric>

#include "common/error.h"

namespace msaflow::parallel {

SyncBatches::SyncBatches(const TrainData& data, int64_t dim, int64_t batch, int64_t epochs, uint64_t data_seed,
                         int rank, int ranks)
    : data_(data),
      dim_(dim),
      batch_(batch),
      epochs_(epochs),
      per_epoch_((data.n + batch - 1) / batch),
      max_rows_((std::min(batch, data.n) + ranks - 1) / ranks),
      rank_(rank),
      ranks_(ranks),
      order_(static_cast<size_t>(data.n)),
      rng_(ShuffleSeed(data_seed, 0)),
      buf_{BatchBuffer(max_rows_, dim), BatchBuffer(max_rows_, dim)} {
  std::iota(order_.begin(), order_.end(), 0);
}

int64_t SyncBatches::Whole(int64_t t) const {
  const int64_t s = (t % per_epoch_) * batch_;
  return std::min(batch_, data_.n - s);
}

void SyncBatches::Gather(int64_t t) {
  if (t != next_ || t >= steps()) Throw(ErrorKind::kInternal, "sync batches gathered out of order");
  ++next_;
  if (t % per_epoch_ == 0) std::shuffle(order_.begin(), order_.end(), rng_);
  const int64_t s = (t % per_epoch_) * batch_, b = Whole(t);
  const int64_t lo = s + b * rank_ / ranks_, hi = s + b * (rank_ + 1) / ranks_;
  buf_[t % 2].Gather(data_, order_.data() + lo, hi - lo, dim_);
  rows_[t % 2] = hi - lo;
}

}  // namespace msaflow::parallel
