// The minibatches of sync training: every epoch the rows in a new shuffled order, cut into
// batches of B, each rank gathering its contiguous share of each batch. Two buffers, so that
// the batch of step t + 1 can be gathered (on a spare thread) while step t trains: the gather
// is a copy of rows scattered over the whole data set, a third of a softmax head's time when
// it ran between the steps.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "parallel/train.h"
#include "parallel/train_util.h"

namespace msaflow::parallel {

class SyncBatches {
 public:
  // The order of epoch e is the one before it shuffled by one std::mt19937_64 seeded with
  // ShuffleSeed(data_seed, 0): the same batches whatever the threads and when they are gathered.
  SyncBatches(const TrainData& data, int64_t dim, int64_t batch, int64_t epochs, uint64_t data_seed, int rank,
              int ranks);

  int64_t per_epoch() const { return per_epoch_; }
  int64_t steps() const { return per_epoch_ * epochs_; }
  // The largest share of a batch one rank gathers.
  int64_t max_rows() const { return max_rows_; }
  // Rows of step t's batch over all ranks (the gradient's divisor).
  int64_t Whole(int64_t t) const;
  // Gathers this rank's share of step t into buffer t % 2. Steps are gathered in order, each once,
  // and step t's buffer is not read while step t + 2 is gathered.
  void Gather(int64_t t);
  const BatchBuffer& Buffer(int64_t t) const { return buf_[t % 2]; }
  int64_t Rows(int64_t t) const { return rows_[t % 2]; }

 private:
  const TrainData data_;
  const int64_t dim_, batch_, epochs_, per_epoch_, max_rows_;
  const int rank_, ranks_;
  std::vector<int64_t> order_;
  std::mt19937_64 rng_;
  int64_t next_ = 0;  // the step Gather expects
  BatchBuffer buf_[2];
  int64_t rows_[2] = {0, 0};
};

}  // namespace msaflow::parallel
