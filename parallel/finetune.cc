#include "parallel/finetune.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>
#include <random>

#include "common/error.h"
#include "parallel/train_util.h"

namespace msaflow::parallel {

void FinetuneData::Batch(const int64_t* rows, int64_t count, std::vector<std::vector<float>>* out,
                         std::vector<kernels::TensorDims>* batch_dims) const {
  out->resize(maps.size());
  batch_dims->resize(maps.size());
  for (size_t i = 0; i < maps.size(); ++i) {
    const int64_t row = kernels::NumElements(dims[i]);
    (*out)[i].resize(static_cast<size_t>(count * row));
    for (int64_t k = 0; k < count; ++k)
      std::memcpy(&(*out)[i][static_cast<size_t>(k * row)], maps[i] + rows[k] * row,
                  static_cast<size_t>(row) * sizeof(float));
    (*batch_dims)[i] = dims[i];
    (*batch_dims)[i].insert((*batch_dims)[i].begin(), count);
  }
}

namespace {

std::vector<const float*> Pointers(const std::vector<std::vector<float>>& v) {
  std::vector<const float*> p;
  p.reserve(v.size());
  for (const auto& x : v) p.push_back(x.data());
  return p;
}

// The tail's weights as one flat vector, and back.
size_t TailSize(const kernels::Tail& t) {
  size_t n = 0;
  for (const auto& p : t.params()) n += p.value.size();
  return n;
}
void GatherTail(const kernels::Tail& t, bool grads, float* out) {
  for (const auto& p : t.params()) {
    const std::vector<float>& v = grads ? p.grad : p.value;
    out = std::copy(v.begin(), v.end(), out);
  }
}
void ScatterTail(const float* in, kernels::Tail* t) {
  for (auto& p : t->params()) {
    std::copy(in, in + p.value.size(), p.value.begin());
    in += p.value.size();
  }
}

// One optimiser over the flat tail: the head's algorithm, the tail's learning rate, no L2.
kernels::Optimizer TailOptimizer(const kernels::HeadConfig& head, double scale, size_t n) {
  kernels::HeadConfig cfg = head;
  cfg.lr = head.lr * scale;
  cfg.l2 = 0;
  return kernels::Optimizer(cfg, {kernels::ParamBlock{0, n, false}}, 0, n);
}

}  // namespace

std::vector<float> TailFeatures(kernels::Tail* tail, const FinetuneData& data, int64_t batch) {
  std::vector<float> out;
  std::vector<std::vector<float>> bufs;
  std::vector<kernels::TensorDims> dims;
  std::vector<int64_t> rows;
  for (int64_t lo = 0; lo < data.n; lo += batch) {
    const int64_t hi = std::min(data.n, lo + batch);
    rows.resize(static_cast<size_t>(hi - lo));
    std::iota(rows.begin(), rows.end(), lo);
    data.Batch(rows.data(), hi - lo, &bufs, &dims);
    const std::vector<float>& f = tail->Forward(Pointers(bufs), dims);
    out.insert(out.end(), f.begin(), f.end());
  }
  return out;
}

TrainStats FinetuneSync(Comm& comm, const FinetuneData& data, kernels::Tail* tail, kernels::Head* h,
                        const FinetuneOptions& opt) {
  const kernels::HeadConfig& cfg = h->config;
  if (cfg.optimizer == "lbfgs")
    Throw(ErrorKind::kInvalidInput,
          "fine-tuning trains by minibatches: the head's optimizer must be adam or sgd, not lbfgs");
  if (!(opt.backbone_lr_scale > 0))
    Throw(ErrorKind::kInvalidInput, "backbone_lr_scale must be positive, got " + std::to_string(opt.backbone_lr_scale));
  if (data.n < 1) Throw(ErrorKind::kInvalidInput, "fine-tuning: no training rows");
  const int N = comm.size(), r = comm.rank();
  const int64_t n = data.n, B = cfg.batch, dim = h->in_dim, per_epoch = (n + B - 1) / B;
  const int64_t max_rows = (std::min(B, n) + N - 1) / N;
  const size_t H = h->params.size(), T = TailSize(*tail);
  Clock clock;
  std::vector<kernels::Optimizer> head_opts;
  for (const kernels::ParamBlock& blk : kernels::ParamLayout(cfg, dim, h->classes))
    head_opts.emplace_back(cfg, std::vector<kernels::ParamBlock>{blk}, blk.offset, blk.offset + blk.size);
  kernels::Optimizer tail_opt = TailOptimizer(cfg, opt.backbone_lr_scale, T);
  kernels::GradientKernel kernel(*h, max_rows);
  std::vector<float> tail_w(T), grad(H + T), xs(static_cast<size_t>(max_rows * dim)), dx(xs.size());
  GatherTail(*tail, false, tail_w.data());
  TailAverage head_avg(per_epoch * cfg.epochs, per_epoch, cfg.epochs),
      tail_avg(per_epoch * cfg.epochs, per_epoch, cfg.epochs);
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(ShuffleSeed(cfg.data_seed, 0));  // the batches of head training (sync_batches.h)
  std::vector<std::vector<float>> bufs;
  std::vector<kernels::TensorDims> dims;
  std::vector<uint8_t> labels(static_cast<size_t>(max_rows));
  const bool slow = opt.straggler.rank == r && opt.straggler.factor > 1;
  int64_t updates = 0;
  for (int64_t e = 0; e < cfg.epochs; ++e) {
    std::shuffle(order.begin(), order.end(), rng);
    double sums[2] = {0, 0};  // loss, correct
    for (int64_t t = 0; t < per_epoch; ++t) {
      const auto t0 = std::chrono::steady_clock::now();
      const int64_t s = t * B, b = std::min(B, n - s);
      const int64_t lo = s + b * r / N, hi = s + b * (r + 1) / N, rows = hi - lo;
      std::fill(grad.begin(), grad.end(), 0.f);
      if (rows > 0) {
        data.Batch(order.data() + lo, rows, &bufs, &dims);
        for (int64_t k = 0; k < rows; ++k) labels[static_cast<size_t>(k)] = data.y[order[static_cast<size_t>(lo + k)]];
        const std::vector<float>& feats = tail->Forward(Pointers(bufs), dims);
        for (int64_t k = 0; k < rows; ++k)
          kernels::StandardizeRow(&feats[static_cast<size_t>(k * dim)], h->mean.data(), h->inv_std.data(), dim,
                                  &xs[static_cast<size_t>(k * dim)]);
        int64_t correct = 0;
        sums[0] += kernel.Accumulate(*h, xs.data(), labels.data(), rows, 1.f / static_cast<float>(b), grad.data(),
                                     &correct, dx.data());
        sums[1] += static_cast<double>(correct);
        // Through the standardisation: d/d(feature) = d/d(standardised) * inv_std.
        for (int64_t k = 0; k < rows; ++k)
          for (int64_t j = 0; j < dim; ++j) dx[static_cast<size_t>(k * dim + j)] *= h->inv_std[static_cast<size_t>(j)];
        tail->Backward(dx.data());
        GatherTail(*tail, true, grad.data() + H);
      }
      if (slow && updates > 0) Straggle(t0, opt.straggler.factor);
      comm.AllreduceSum(grad.data(), grad.size());
      ++updates;
      for (kernels::Optimizer& o : head_opts) o.Step(h->params.data() + o.lo(), grad.data() + o.lo());
      tail_opt.Step(tail_w.data(), grad.data() + H);
      ScatterTail(tail_w.data(), tail);
      head_avg.Add(updates, h->params.data(), H);
      tail_avg.Add(updates, tail_w.data(), T);
    }
    comm.AllreduceSum(sums, 2);
    h->curve.push_back({updates, clock.Seconds(), sums[0] / static_cast<double>(n), sums[1] / static_cast<double>(n)});
  }
  head_avg.Finish(h->params.data(), H);
  tail_avg.Finish(tail_w.data(), T);
  ScatterTail(tail_w.data(), tail);
  TrainStats st;
  st.mode = workflow::TrainMode::kSync;
  st.ranks = N;
  st.updates = updates;
  st.seconds = clock.Seconds();
  return st;
}

}  // namespace msaflow::parallel
