// Optimizer "lbfgs": full-batch L-BFGS (kernels/lbfgs.h) on mean cross-entropy + l2/2 |W|^2,
// the objective of scikit-learn's LogisticRegression(solver="lbfgs") with C = 1 / (n l2).
// Data-parallel like sync: each rank computes the gradient of its contiguous shard of the rows,
// an allreduce sums them, and every rank takes the same step. `epochs` caps the iterations.
#include <algorithm>
#include <cmath>

#include "kernels/lbfgs.h"
#include "parallel/train.h"
#include "parallel/train_util.h"

namespace msaflow::parallel {

TrainStats TrainLbfgs(Comm& comm, const TrainData& data, kernels::Head* h) {
  const kernels::HeadConfig& cfg = h->config;
  const int64_t n = data.n, dim = h->in_dim;
  const int N = comm.size(), r = comm.rank();
  const int64_t lo = n * r / N, hi = n * (r + 1) / N;
  constexpr int64_t kChunk = 1024;  // rows per gradient pass; the kernel's buffers are this big
  Stopwatch watch;
  kernels::GradientKernel kernel(*h, std::max<int64_t>(1, std::min(kChunk, hi - lo)));
  const auto layout = kernels::ParamLayout(cfg, dim, h->classes);
  std::vector<float> grad(h->params.size());
  // Raw rows are standardised a chunk at a time (TrainData); standardised ones are read in place.
  std::vector<float> chunk(data.mean ? static_cast<size_t>(std::min(kChunk, hi - lo) * dim) : 0);
  double last[2] = {0, 0};  // the data loss and accuracy at the last point evaluated
  auto objective = [&](const std::vector<double>& w, std::vector<double>& g) {
    for (size_t i = 0; i < w.size(); ++i) h->params[i] = static_cast<float>(w[i]);
    std::fill(grad.begin(), grad.end(), 0.f);
    double sums[2] = {0, 0};  // loss, correct
    for (int64_t s = lo; s < hi; s += kChunk) {
      const int64_t b = std::min(kChunk, hi - s);
      int64_t correct = 0;
      const float* rows = data.x + s * dim;
      if (data.mean) {
        data.Rows(s, s + b, dim, chunk.data());
        rows = chunk.data();
      }
      sums[0] += kernel.Accumulate(*h, rows, data.y + s, b, 1.f / static_cast<float>(n), grad.data(), &correct);
      sums[1] += static_cast<double>(correct);
    }
    comm.AllreduceSum(grad.data(), grad.size());
    comm.AllreduceSum(sums, 2);
    last[0] = sums[0] / static_cast<double>(n);
    last[1] = sums[1] / static_cast<double>(n);
    double penalty = 0;
    for (size_t i = 0; i < g.size(); ++i) g[i] = grad[i];
    for (const auto& blk : layout) {
      if (!blk.decay) continue;
      for (size_t i = blk.offset; i < blk.offset + blk.size; ++i) {
        penalty += w[i] * w[i];
        g[i] += cfg.l2 * w[i];
      }
    }
    return last[0] + 0.5 * cfg.l2 * penalty;
  };
  std::vector<double> w(h->params.begin(), h->params.end());
  kernels::LbfgsOptions opt;
  opt.max_iterations = static_cast<int>(std::min<int64_t>(cfg.epochs, 1 << 20));
  const auto res = kernels::MinimizeLbfgs(w, objective, opt, [&](int k, double) {
    h->curve.push_back({k, watch.Seconds(), last[0], last[1]});
  });
  for (size_t i = 0; i < w.size(); ++i) h->params[i] = static_cast<float>(w[i]);
  if (h->curve.empty()) h->curve.push_back({0, watch.Seconds(), last[0], last[1]});  // converged at the start
  TrainStats st;
  st.mode = workflow::TrainMode::kSync;
  st.ranks = N;
  st.updates = res.iterations;
  st.seconds = watch.Seconds();
  st.solver = {{"name", "lbfgs"}, {"iterations", res.iterations}, {"evaluations", res.evaluations},
               {"objective", res.f}, {"max_gradient", res.max_gradient}, {"stop", res.stop}};
  return st;
}

}  // namespace msaflow::parallel
