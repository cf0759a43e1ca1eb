#include "parallel/finetune.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>

#include "common/error.h"
#include "parallel/train_util.h"

namespace msaflow::parallel {

void FinetuneData::Shuffle(std::vector<int64_t>& rows, std::mt19937_64& rng) const {
  std::shuffle(rows.begin(), rows.end(), rng);
}

void FinetuneData::Expect(const int64_t* /*rows*/, int64_t /*count*/) {}

void FinetuneArrays::Batch(const int64_t* rows, int64_t count, std::vector<std::vector<float>>* out,
                           std::vector<kernels::TensorDims>* batch_dims) {
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
  return kernels::Optimizer(TailConfig(head, scale), {kernels::ParamBlock{0, n, false}}, 0, n);
}

// The tail's gradients summed over the ranks in buckets while the backward pass goes on (as
// Horovod's tensor fusion and PyTorch DDP's buckets do it): whole params, about bucket_bytes a
// bucket, formed from the last param back, since the backward pass finishes the last params
// first. Each bucket's grads are copied into its run of `dst` (the tail's part of the step's
// gradient, params in order) and its sum started as soon as they are final.
class TailBuckets {
 public:
  TailBuckets(const kernels::Tail& tail, size_t bucket_bytes, float* dst) : dst_(dst) {
    const auto& ps = tail.params();
    std::vector<size_t> offset(ps.size() + 1, 0);
    for (size_t p = 0; p < ps.size(); ++p) offset[p + 1] = offset[p] + ps[p].value.size();
    size_t end = ps.size();
    for (size_t p = ps.size(); p-- > 0;) {
      const bool full = bucket_bytes > 0 && (offset[end] - offset[p]) * sizeof(float) >= bucket_bytes;
      if (full || p == 0) {
        buckets_.push_back({p, end, offset[p]});
        end = p;
      }
    }
  }
  size_t count() const { return buckets_.size(); }
  void Reset() { started_ = 0; }
  // Starts every bucket whose params from first_final on are final (Tail::Backward's FinalFrom).
  void Ready(Comm& comm, kernels::Tail& tail, size_t first_final) {
    for (; started_ < buckets_.size() && buckets_[started_].first >= first_final; ++started_) {
      const Bucket& b = buckets_[started_];
      float* out = dst_ + b.offset;
      for (size_t p = b.first; p < b.end; ++p)
        out = std::copy(tail.params()[p].grad.begin(), tail.params()[p].grad.end(), out);
      comm.StartSum(dst_ + b.offset, static_cast<size_t>(out - (dst_ + b.offset)));
    }
    comm.ProgressSums();
  }

 private:
  struct Bucket {
    size_t first, end;  // params [first, end)
    size_t offset;      // where they start in dst
  };
  std::vector<Bucket> buckets_;  // in the order the backward pass finishes them
  size_t started_ = 0;
  float* dst_;
};

// One rank's share of one training step: `rows` rows of the global batch of `batch` through the
// tail and the head, forward and backward, its gradients (batch-mean shares) into grad (the
// head's, then the tail's as `tail_final` places them); sums[0..1] += loss, correct. head_done
// runs once the head's gradient is in grad; tail_final as Tail::Backward's FinalFrom. A rank
// without rows calls both all the same, with zeros, so every rank starts the same sums.
class StepGradient {
 public:
  StepGradient(const kernels::Head& h, int64_t max_rows)
      : kernel_(h, max_rows),
        xs_(static_cast<size_t>(max_rows * h.in_dim)),
        dx_(xs_.size()),
        labels_(static_cast<size_t>(max_rows)) {}
  void Run(FinetuneData& data, const int64_t* order, int64_t rows, int64_t batch, kernels::Tail* tail,
           const kernels::Head& h, float* grad, double* sums, const std::function<void()>& head_done,
           const kernels::Tail::FinalFrom& tail_final) {
    if (rows <= 0) {
      head_done();
      for (auto& p : tail->params()) std::fill(p.grad.begin(), p.grad.end(), 0.f);
      tail_final(0);
      return;
    }
    const int64_t dim = h.in_dim;
    data.Batch(order, rows, &bufs_, &dims_);
    for (int64_t k = 0; k < rows; ++k) labels_[static_cast<size_t>(k)] = data.y[order[k]];
    const std::vector<float>& feats = tail->Forward(Pointers(bufs_), dims_);
    for (int64_t k = 0; k < rows; ++k)
      kernels::StandardizeRow(&feats[static_cast<size_t>(k * dim)], h.mean.data(), h.inv_std.data(), dim,
                              &xs_[static_cast<size_t>(k * dim)]);
    int64_t correct = 0;
    sums[0] += kernel_.Accumulate(h, xs_.data(), labels_.data(), rows, 1.f / static_cast<float>(batch), grad, &correct,
                                  dx_.data());
    sums[1] += static_cast<double>(correct);
    head_done();
    // Through the standardisation: d/d(feature) = d/d(standardised) * inv_std.
    for (int64_t k = 0; k < rows; ++k)
      for (int64_t j = 0; j < dim; ++j) dx_[static_cast<size_t>(k * dim + j)] *= h.inv_std[static_cast<size_t>(j)];
    tail->Backward(dx_.data(), nullptr, tail_final);
  }

 private:
  kernels::GradientKernel kernel_;
  std::vector<float> xs_, dx_;
  std::vector<uint8_t> labels_;
  std::vector<std::vector<float>> bufs_;
  std::vector<kernels::TensorDims> dims_;
};

void CheckOptions(const kernels::Head& hd, const FinetuneData& data, const FinetuneOptions& opt) {
  if (hd.config.optimizer == "lbfgs")
    Throw(ErrorKind::kInvalidInput,
          "fine-tuning trains by minibatches: the head's optimizer must be adam or sgd, not lbfgs");
  if (!(opt.backbone_lr_scale > 0))
    Throw(ErrorKind::kInvalidInput, "backbone_lr_scale must be positive, got " + std::to_string(opt.backbone_lr_scale));
  if (data.n < 1) Throw(ErrorKind::kInvalidInput, "fine-tuning: no training rows");
}

}  // namespace

std::vector<float> TailFeatures(kernels::Tail* tail, FinetuneData& data, int64_t batch, int64_t lo, int64_t hi) {
  std::vector<float> out;
  out.reserve(static_cast<size_t>(std::max<int64_t>(0, hi - lo) * tail->FeatureDim()));
  std::vector<std::vector<float>> bufs;
  std::vector<kernels::TensorDims> dims;
  std::vector<int64_t> rows(static_cast<size_t>(std::max<int64_t>(0, hi - lo)));
  std::iota(rows.begin(), rows.end(), lo);
  data.Expect(rows.data(), static_cast<int64_t>(rows.size()));
  for (int64_t s = lo; s < hi; s += batch) {
    const int64_t e = std::min(hi, s + batch);
    data.Batch(rows.data() + (s - lo), e - s, &bufs, &dims);
    const std::vector<float>& f = tail->Forward(Pointers(bufs), dims);
    out.insert(out.end(), f.begin(), f.end());
  }
  return out;
}

TrainStats FinetuneSync(Comm& comm, FinetuneData& data, kernels::Tail* tail, kernels::Head* h,
                        const FinetuneOptions& opt) {
  CheckOptions(*h, data, opt);
  const kernels::HeadConfig& cfg = h->config;
  const int N = comm.size(), r = comm.rank();
  const int64_t n = data.n, B = cfg.batch, per_epoch = (n + B - 1) / B;
  const size_t H = h->params.size(), T = TailSize(*tail);
  Stopwatch watch;
  std::vector<kernels::Optimizer> head_opts;
  for (const kernels::ParamBlock& blk : kernels::ParamLayout(cfg, h->in_dim, h->classes))
    head_opts.emplace_back(cfg, std::vector<kernels::ParamBlock>{blk}, blk.offset, blk.offset + blk.size);
  kernels::Optimizer tail_opt = TailOptimizer(cfg, opt.backbone_lr_scale, T);
  std::vector<float> tail_w(T), grad(H + T);
  GatherTail(*tail, false, tail_w.data());
  TailBuckets buckets(*tail, opt.bucket_bytes, grad.data() + H);
  StepGradient step(*h, (std::min(B, n) + N - 1) / N);
  TailAverage head_avg(per_epoch * cfg.epochs, per_epoch, cfg.epochs),
      tail_avg(per_epoch * cfg.epochs, per_epoch, cfg.epochs);
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(ShuffleSeed(cfg.data_seed, 0));  // the batches of head training (sync_batches.h)
  const bool slow = opt.straggler.rank == r && opt.straggler.factor > 1;
  int64_t updates = 0;
  double waited = 0;
  std::vector<int64_t> mine;  // this rank's rows of an epoch's batches, in the order it reads them
  for (int64_t e = 0; e < cfg.epochs; ++e) {
    data.Shuffle(order, rng);
    mine.clear();
    for (int64_t t = 0; t < per_epoch; ++t) {
      const int64_t s = t * B, b = std::min(B, n - s);
      mine.insert(mine.end(), order.begin() + s + b * r / N, order.begin() + s + b * (r + 1) / N);
    }
    data.Expect(mine.data(), static_cast<int64_t>(mine.size()));
    double sums[2] = {0, 0};  // loss, correct
    for (int64_t t = 0; t < per_epoch; ++t) {
      const auto t0 = std::chrono::steady_clock::now();
      const int64_t s = t * B, b = std::min(B, n - s);
      const int64_t lo = s + b * r / N, hi = s + b * (r + 1) / N;
      std::fill(grad.begin(), grad.end(), 0.f);
      buckets.Reset();
      // The head's gradient is summed while the tail's backward pass runs, and each bucket of the
      // tail's as soon as its weights' gradients are final; in the same order on every rank.
      step.Run(
          data, order.data() + lo, hi - lo, b, tail, *h, grad.data(), sums, [&] { comm.StartSum(grad.data(), H); },
          [&](size_t first_final) { buckets.Ready(comm, *tail, first_final); });
      if (slow && updates > 0) Straggle(t0, opt.straggler.factor);
      const auto w0 = std::chrono::steady_clock::now();
      comm.FinishSums();
      waited += std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
      ++updates;
      for (kernels::Optimizer& o : head_opts) o.Step(h->params.data() + o.lo(), grad.data() + o.lo());
      tail_opt.Step(tail_w.data(), grad.data() + H);
      ScatterTail(tail_w.data(), tail);
      head_avg.Add(updates, h->params.data(), H);
      tail_avg.Add(updates, tail_w.data(), T);
    }
    comm.AllreduceSum(sums, 2);
    h->curve.push_back({updates, watch.Seconds(), sums[0] / static_cast<double>(n), sums[1] / static_cast<double>(n)});
  }
  head_avg.Finish(h->params.data(), H);
  tail_avg.Finish(tail_w.data(), T);
  ScatterTail(tail_w.data(), tail);
  TrainStats st;
  st.mode = workflow::TrainMode::kSync;
  st.ranks = N;
  st.updates = updates;
  st.seconds = watch.Seconds();
  st.buckets = static_cast<int64_t>(buckets.count()) + 1;
  st.wait_seconds = waited;
  return st;
}

TrainStats FinetuneParameterServer(Comm& world, FinetuneData& data, kernels::Tail* tail, kernels::Head* h,
                                   const FinetuneOptions& opt, const PsOptions& ps) {
  CheckOptions(*h, data, opt);
  const size_t H = h->params.size(), T = TailSize(*tail);
  std::vector<float> flat(H + T);  // the servers' vector: the head's parameters, then the tail's weights
  std::copy(h->params.begin(), h->params.end(), flat.begin());
  GatherTail(*tail, false, flat.data() + H);
  StepGradient step(*h, std::min(h->config.batch, data.n));
  PsModel m;
  m.h = h;
  m.n = data.n;
  m.params = flat.data();
  m.P = H + T;
  m.head_size = H;
  m.tail_lr_scale = opt.backbone_lr_scale;
  m.shuffle = [&](std::vector<int64_t>& rows, std::mt19937_64& rng) { data.Shuffle(rows, rng); };
  m.expect = [&](const int64_t* rows, int64_t count) { data.Expect(rows, count); };
  m.gradient = [&](const int64_t* rows, int64_t count, int64_t batch, float* grad, int64_t* correct) {
    std::copy(flat.begin(), flat.begin() + static_cast<ptrdiff_t>(H), h->params.begin());  // a reply's fresh weights
    ScatterTail(flat.data() + H, tail);
    double sums[2] = {0, 0};
    step.Run(
        data, rows, count, batch, tail, *h, grad, sums, [] {}, [](size_t) {});
    if (count > 0) GatherTail(*tail, true, grad + H);
    *correct = static_cast<int64_t>(sums[1]);
    return sums[0];
  };
  TrainStats st = TrainWithServers(world, m, ps);
  if (world.rank() == 0) {  // server 0 holds the trained vector
    std::copy(flat.begin(), flat.begin() + static_cast<ptrdiff_t>(H), h->params.begin());
    ScatterTail(flat.data() + H, tail);
  }
  return st;
}

}  // namespace msaflow::parallel
