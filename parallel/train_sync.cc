#include <algorithm>
#include <chrono>
#include <numeric>
#include <random>
#include <thread>

#include "parallel/train.h"
#include "parallel/train_util.h"

namespace msaflow::parallel {

nlohmann::json TrainStats::ToJson() const {
  nlohmann::json j = {{"mode", mode},       {"ranks", ranks},     {"servers", servers}, {"groups", groups},
                      {"updates", updates}, {"seconds", seconds}};
  if (mode == "async" || mode == "hybrid") {
    j["refused"] = refused;
    j["staleness"] = {{"mean", staleness_mean}, {"max", staleness_max}};
    j[mode == "hybrid" ? "updates_per_group" : "updates_per_worker"] = updates_per_worker;
    j[mode == "hybrid" ? "refused_per_group" : "refused_per_worker"] = refused_per_worker;
  }
  if (!solver.is_null()) j["solver"] = solver;
  return j;
}

TrainStats TrainSync(Comm& comm, const TrainData& data, kernels::Head* h, const Straggler& straggler) {
  if (h->config.optimizer == "lbfgs") return TrainLbfgs(comm, data, h);
  const kernels::HeadConfig& cfg = h->config;
  const int64_t n = data.n, dim = h->in_dim, B = cfg.batch;
  const int N = comm.size(), r = comm.rank();
  Clock clock;
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(ShuffleSeed(cfg.seed, 0));
  const int64_t max_rows = (std::min(B, n) + N - 1) / N;
  kernels::GradientKernel kernel(*h, max_rows);
  BatchBuffer batch(max_rows, dim);
  auto layout = kernels::ParamLayout(cfg, dim, h->classes);
  std::vector<float> grad(h->params.size());
  kernels::Optimizer opt(cfg, layout, 0, h->params.size());
  const int64_t per_epoch = (n + B - 1) / B;
  TailAverage tail(per_epoch * cfg.epochs, per_epoch, cfg.epochs);
  const bool slow = straggler.rank == r && straggler.factor > 1;
  TrainStats st;
  st.mode = "sync";
  st.ranks = N;
  for (int64_t e = 0; e < cfg.epochs; ++e) {
    std::shuffle(order.begin(), order.end(), rng);
    double sums[2] = {0, 0};  // loss, correct
    for (int64_t s = 0; s < n; s += B) {
      auto t0 = std::chrono::steady_clock::now();
      int64_t b = std::min(B, n - s);
      int64_t lo = s + b * r / N, hi = s + b * (r + 1) / N;
      batch.Gather(data, order.data() + lo, hi - lo, dim);
      std::fill(grad.begin(), grad.end(), 0.f);
      int64_t correct = 0;
      sums[0] += kernel.Accumulate(*h, batch.x.data(), batch.y.data(), hi - lo, 1.f / static_cast<float>(b), grad.data(),
                                   &correct);
      sums[1] += static_cast<double>(correct);
      if (slow) Straggle(t0, straggler.factor);
      comm.AllreduceSum(grad.data(), grad.size());
      opt.Step(h->params.data(), grad.data());
      tail.Add(opt.steps(), h->params.data(), h->params.size());
    }
    comm.AllreduceSum(sums, 2);
    h->curve.push_back({opt.steps(), clock.Seconds(), sums[0] / static_cast<double>(n), sums[1] / static_cast<double>(n)});
  }
  tail.Finish(h->params.data(), h->params.size());
  st.updates = opt.steps();
  st.seconds = clock.Seconds();
  return st;
}

}  // namespace msaflow::parallel
