// Fine-tuning (docs/finetune.md): a backbone's tail (kernels/tail.h) trained together with its
// head on the activations cached at the freeze point, data-parallel and synchronous over the
// ranks of a communicator. Every step each rank runs its contiguous share of the global batch
// through the tail and the head, forward and backward; the gradients of the head and of every
// tail weight are summed with one allreduce, and every rank applies the same update: the head's
// optimiser with its own learning rate, the tail's with the head's learning rate times
// backbone_lr_scale (Adam or SGD as the head says; no L2 on the tail). The sums overlap the
// backward pass: the head's gradient is summed while the tail's backward pass runs, and the
// tail's in buckets as the pass finishes them (FinetuneOptions::bucket_bytes). The batches are the ones
// head training draws (parallel/sync_batches.h: the same shuffle of the same seed), so with the
// same seed one rank and N ranks train the same weights up to the summation order of the
// gradients. The trained weights are the average of the last epoch's iterates (2 epochs or more),
// as for heads.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/head.h"
#include "kernels/tail.h"
#include "parallel/comm.h"
#include "parallel/train.h"

namespace msaflow::parallel {

// The cached maps at the freeze point: for each tail input, n rows of that input's one-image
// dims (C x H x W), row-major and contiguous; and the labels.
struct FinetuneData {
  std::vector<const float*> maps;
  std::vector<kernels::TensorDims> dims;
  const uint8_t* y = nullptr;
  int64_t n = 0;
  // Rows [lo, hi) of every input, as the tail's batch inputs (dims with the batch first).
  void Batch(const int64_t* rows, int64_t count, std::vector<std::vector<float>>* out,
             std::vector<kernels::TensorDims>* batch_dims) const;
};

// The tail's pooled features of every row (n x tail.FeatureDim()), with the tail's current
// weights, `batch` rows at a time: the frozen features a head is initialised on (InitHead).
std::vector<float> TailFeatures(kernels::Tail* tail, const FinetuneData& data, int64_t batch);

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
TrainStats FinetuneSync(Comm& comm, const FinetuneData& data, kernels::Tail* tail, kernels::Head* h,
                        const FinetuneOptions& opt);

// Async (ps.groups 0) or hybrid fine-tuning over `world`, as TrainParameterServer trains heads
// (parallel/train.h): the servers own slices of one vector, the head's parameters and then the
// tail's weights, and apply the workers' gradients with the head's optimiser on the head's part
// and the tail's (learning rate x backbone_lr_scale, no L2) on the rest; each worker computes
// the gradient of its batches through the tail and the head at the weights it was last sent.
// On return rank 0 (a server) holds the trained head and tail; the other ranks' are stale.
// opt.straggler is not read (ps.straggler is). Throws as FinetuneSync, and as
// TrainParameterServer when the ranks do not fit.
TrainStats FinetuneParameterServer(Comm& world, const FinetuneData& data, kernels::Tail* tail, kernels::Head* h,
                                   const FinetuneOptions& opt, const PsOptions& ps);

}  // namespace msaflow::parallel
