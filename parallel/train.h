// Data-parallel training of one head over the ranks of a communicator (docs/parallel.md):
//   sync   every rank computes the gradient of its part of each global batch; the gradients
//          are summed with an allreduce and every rank applies the same update. With the same
//          seed and batch the result equals one rank's up to floating-point summation order.
//   async  parameter-server ranks own slices of the parameters and apply each worker's gradient
//          in arrival order, answering with fresh weights; workers never wait for each other. A
//          gradient more than max_staleness updates old is refused, and its worker carries on
//          from the fresh weights it is sent.
//   hybrid the workers form groups that are synchronous inside (allreduce on the group's
//          communicator) and asynchronous across: each group's leader talks to the servers.
// Every rank holds the whole (standardised) training set; a worker or group draws its batches
// from its own contiguous shard of it. In every mode the trained weights are the average of
// the last epoch's iterates (with 2 epochs or more).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

#include "kernels/head.h"
#include "parallel/comm.h"
#include "workflow/kinds.h"

namespace msaflow::parallel {

// Experiment knob: gradient rank `rank` (0-based among the gradient ranks) takes `factor` times
// as long per step as it would (it sleeps factor - 1 times each step's duration).
struct Straggler {
  int64_t rank = -1;
  double factor = 1;
};

struct PsOptions {
  int64_t servers = 1;
  int64_t groups = 0;  // 0: async (every worker on its own); G: hybrid, G synchronous groups
  int64_t max_staleness = 16;
  Straggler straggler;
};

// What a training run did, for the model's metadata.
struct TrainStats {
  workflow::TrainMode mode = workflow::TrainMode::kSync;
  int64_t ranks = 1, servers = 0, groups = 1;
  int64_t updates = 0;   // optimiser updates applied
  int64_t refused = 0;   // async/hybrid: gradients refused as too stale
  double staleness_mean = 0;
  int64_t staleness_max = 0;
  std::vector<int64_t> updates_per_worker;  // async: per worker; hybrid: per group
  std::vector<int64_t> refused_per_worker;
  double seconds = 0;
  nlohmann::json solver;  // lbfgs: iterations, evaluations, objective, max_gradient, stop
  int64_t together = 1;   // heads trained together in one batch (TrainSyncTogether), this one included
  int64_t buckets = 0;    // sync fine-tuning: the sums a step's gradient is summed in
  double wait_seconds = 0;  // sync fine-tuning: time waiting for the sums after the backward pass
  nlohmann::json ToJson() const;
};

// The rows a training run sees: features (n x dim, dim = head's in_dim) and labels. With mean
// and inv_std (dim each, a head's standardisation) x is raw and each row is standardised as it
// is read (kernels::StandardizeRow, as kernels::Head::Standardize does it), so training
// needs no standardised copy of the whole set; without them x is standardised already.
struct TrainData {
  const float* x = nullptr;
  const uint8_t* y = nullptr;
  int64_t n = 0;
  const float* mean = nullptr;
  const float* inv_std = nullptr;
  // Rows [lo, hi) into out ((hi - lo) x dim), standardised.
  void Rows(int64_t lo, int64_t hi, int64_t dim, float* out) const;
  // Row `row` into out (dim floats), standardised.
  void Row(int64_t row, int64_t dim, float* out) const;
};

// Sync mode over every rank of `comm` (one rank: plain minibatch training). `h` comes from
// kernels::InitHead, identical on every rank; on return every rank holds the trained head.
// A head whose optimizer is "lbfgs" is trained by TrainLbfgs instead (no straggler).
TrainStats TrainSync(Comm& comm, const TrainData& data, kernels::Head* h, const Straggler& straggler = {});

// Whether two heads (from InitHead) can be trained together by TrainSyncTogether: minibatch
// optimisers, the same features (in_dim, classes, standardisation) and the same batches (batch
// size, epochs, data_seed). Their learning rates, l2, optimisers, types and widths may differ.
bool CanTrainTogether(const kernels::Head& a, const kernels::Head& b);

// Sync mode for several heads at once: every step serves all of them from one batch, with one
// GEMM for all their first layers and one allreduce for all their gradients; each head keeps
// its own optimiser. Each head ends as TrainSync would train it alone (up to the summation
// order of the GEMMs). Throws kInternal unless every head CanTrainTogether with the first.
std::vector<TrainStats> TrainSyncTogether(Comm& comm, const TrainData& data, const std::vector<kernels::Head*>& heads,
                                          const Straggler& straggler = {});

// Full-batch L-BFGS on mean cross-entropy + l2/2 |W|^2 (parallel/train_lbfgs.cc), the rows
// sharded over the ranks and the gradients summed by allreduce; `epochs` caps the iterations.
// The curve has a point per iteration.
TrainStats TrainLbfgs(Comm& comm, const TrainData& data, kernels::Head* h);

// Async or hybrid over `world`: ranks 0..servers-1 are the parameter servers, the rest workers.
// On return rank 0 holds the trained head (with the curve); the other ranks' copies are stale.
// Throws kInvalidInput when the ranks do not fit the options.
TrainStats TrainParameterServer(Comm& world, const TrainData& data, kernels::Head* h, const PsOptions& opt);

}  // namespace msaflow::parallel
