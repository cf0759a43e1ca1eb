// Fine-tuning (docs/finetune.md): a backbone's tail (kernels/tail.h) trained together with its
// head on the activations cached at the freeze point, data-parallel and synchronous over the
// ranks of a communicator. Every step each rank runs its contiguous share of the global batch
// through the tail and the head, forward and backward; the gradients of the head and of every
// tail weight are summed with one allreduce, and every rank applies the same update: the head's
// optimiser with its own learning rate, the tail's with the head's learning rate times
// backbone_lr_scale (Adam or SGD as the head says; no L2 on the tail). The sums overlap the
// backward pass: the head's gradient is summed while the tail's backward pass runs, and the
// tail's in buckets as the pass finishes them (FinetuneOptions::bucket_bytes). The batches are
// the ones head training draws (parallel/sync_batches.h: the same shuffle of the same seed; a
// source that streams its maps keeps windows of parts together, FinetuneData::Shuffle), so with
// the same seed one rank and N ranks train the same weights up to the summation order of the
// gradients. The trained weights are the average of the last epoch's iterates (2 epochs or
// more), as for heads.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/head.h"
#include "kernels/tail.h"
#include "parallel/comm.h"
#include "parallel/train.h"

namespace msaflow::parallel {

// Where fine-tuning reads the maps cached at the freeze point: n rows, each every tail input's
// values for one image, and their labels. A source may fetch rows ahead: Expect says which rows
// the next Batch calls read, in order (modules/finetune_maps.h streams them from the NAM so, a
// part at a time); FinetuneArrays holds them in memory. One thread reads a source.
class FinetuneData {
 public:
  virtual ~FinetuneData() = default;
  std::vector<kernels::TensorDims> dims;  // one image's dims per tail input (C x H x W)
  const uint8_t* y = nullptr;             // every row's label
  int64_t n = 0;
  // `rows` in an epoch's order, drawn from rng: std::shuffle here; a streaming source keeps the
  // rows of a few of its parts together (and draws from rng all the same).
  virtual void Shuffle(std::vector<int64_t>& rows, std::mt19937_64& rng) const;
  // The rows the next Batch calls read, in that order, after those expected before. Rows read
  // without being expected are read all the same (fetched then).
  virtual void Expect(const int64_t* rows, int64_t count);
  // The rows as the tail's batch inputs (dims with the batch first).
  virtual void Batch(const int64_t* rows, int64_t count, std::vector<std::vector<float>>* out,
                     std::vector<kernels::TensorDims>* batch_dims) = 0;
};

// Maps in memory: for each tail input, n rows of that input's one-image dims, row-major and
// contiguous.
class FinetuneArrays : public FinetuneData {
 public:
  std::vector<const float*> maps;
  void Batch(const int64_t* rows, int64_t count, std::vector<std::vector<float>>* out,
             std::vector<kernels::TensorDims>* batch_dims) override;
};

// The tail's pooled features of rows [lo, hi) ((hi - lo) x tail.FeatureDim()), with the tail's
// current weights, `batch` rows at a time: of every row, the frozen features a head is
// initialised on (InitHead); of a shard, what evaluation scores.
std::vector<float> TailFeatures(kernels::Tail* tail, FinetuneData& data, int64_t batch, int64_t lo, int64_t hi);
inline std::vector<float> TailFeatures(kernels::Tail* tail, FinetuneData& data, int64_t batch) {
  return TailFeatures(tail, data, batch, 0, data.n);
}

struct FinetuneOptions {
  double backbone_lr_scale = 0.1;
  // The tail's gradients are summed over the ranks in buckets of about this many bytes (whole
  // weights), each as soon as the backward pass has finished it; 0: one sum after the pass.
  size_t bucket_bytes = size_t{64} << 10;
  Straggler straggler;
};

// Sync fine-tuning over every rank of `comm` (one rank: plain minibatch training). `h` comes from
// kernels::InitHead on TailFeatures (or a warm start), the same on every rank, and so does the
// tail's weights; on return every rank holds the trained head and tail. h->curve gets a point
// per epoch. Throws kInvalidInput for an L-BFGS head (full-batch: not for a tail) or a learning
// rate scale that is not positive.
TrainStats FinetuneSync(Comm& comm, FinetuneData& data, kernels::Tail* tail, kernels::Head* h,
                        const FinetuneOptions& opt);

// Async (ps.groups 0) or hybrid fine-tuning over `world`, as TrainParameterServer trains heads
// (parallel/train.h): the servers own slices of one vector, the head's parameters and then the
// tail's weights, and apply the workers' gradients with the head's optimiser on the head's part
// and the tail's (learning rate x backbone_lr_scale, no L2) on the rest; each worker computes
// the gradient of its batches through the tail and the head at the weights it was last sent.
// On return rank 0 (a server) holds the trained head and tail; the other ranks' are stale.
// opt.straggler is not read (ps.straggler is). Throws as FinetuneSync, and as
// TrainParameterServer when the ranks do not fit.
TrainStats FinetuneParameterServer(Comm& world, FinetuneData& data, kernels::Tail* tail, kernels::Head* h,
                                   const FinetuneOptions& opt, const PsOptions& ps);

}  // namespace msaflow::parallel
