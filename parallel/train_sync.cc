#include <algorithm>
#include <chrono>
#include <numeric>
#include <random>
#include <thread>

#include "common/error.h"
#include "kernels/head_batch.h"
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
  if (together > 1) j["trained_together"] = together;
  return j;
}

bool CanTrainTogether(const kernels::Head& a, const kernels::Head& b) {
  const kernels::HeadConfig &x = a.config, &y = b.config;
  return x.optimizer != "lbfgs" && y.optimizer != "lbfgs" && a.in_dim == b.in_dim && a.classes == b.classes &&
         x.batch == y.batch && x.epochs == y.epochs && x.data_seed == y.data_seed && a.mean == b.mean &&
         a.inv_std == b.inv_std;
}

TrainStats TrainSync(Comm& comm, const TrainData& data, kernels::Head* h, const Straggler& straggler) {
  if (h->config.optimizer == "lbfgs") return TrainLbfgs(comm, data, h);
  return TrainSyncTogether(comm, data, {h}, straggler)[0];
}

std::vector<TrainStats> TrainSyncTogether(Comm& comm, const TrainData& data, const std::vector<kernels::Head*>& heads,
                                          const Straggler& straggler) {
  for (const kernels::Head* h : heads)
    if (!CanTrainTogether(*heads[0], *h))
      Throw(ErrorKind::kInternal, "TrainSyncTogether: heads that cannot be trained together");
  const kernels::HeadConfig& cfg = heads[0]->config;
  const int64_t n = data.n, dim = heads[0]->in_dim, B = cfg.batch;
  const size_t K = heads.size();
  const int N = comm.size(), r = comm.rank();
  Clock clock;
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(ShuffleSeed(cfg.data_seed, 0));
  const int64_t max_rows = (std::min(B, n) + N - 1) / N;
  const std::vector<const kernels::Head*> members(heads.begin(), heads.end());
  kernels::HeadBatch kernel(members, max_rows);
  std::vector<float> params(kernel.size()), grad(kernel.size());
  kernel.Pack(members, params.data());
  // Each head's own optimiser (its lr, l2, algorithm) over each of its blocks in the vector.
  std::vector<std::vector<kernels::Optimizer>> opts(K);
  for (size_t k = 0; k < K; ++k)
    for (const kernels::ParamBlock& blk : kernel.Blocks(k))
      opts[k].emplace_back(heads[k]->config, std::vector<kernels::ParamBlock>{blk}, blk.offset, blk.offset + blk.size);
  BatchBuffer batch(max_rows, dim);
  const int64_t per_epoch = (n + B - 1) / B;
  TailAverage tail(per_epoch * cfg.epochs, per_epoch, cfg.epochs);
  const bool slow = straggler.rank == r && straggler.factor > 1;
  int64_t updates = 0;
  std::vector<double> loss(K), sums(2 * K);  // per head: loss, correct
  std::vector<int64_t> correct(K);
  for (int64_t e = 0; e < cfg.epochs; ++e) {
    std::shuffle(order.begin(), order.end(), rng);
    std::fill(sums.begin(), sums.end(), 0.0);
    for (int64_t s = 0; s < n; s += B) {
      auto t0 = std::chrono::steady_clock::now();
      int64_t b = std::min(B, n - s);
      int64_t lo = s + b * r / N, hi = s + b * (r + 1) / N;
      batch.Gather(data, order.data() + lo, hi - lo, dim);
      std::fill(grad.begin(), grad.end(), 0.f);
      std::fill(loss.begin(), loss.end(), 0.0);
      std::fill(correct.begin(), correct.end(), 0);
      kernel.Accumulate(params.data(), batch.x.data(), batch.y.data(), hi - lo, 1.f / static_cast<float>(b),
                        grad.data(), loss.data(), correct.data());
      for (size_t k = 0; k < K; ++k) {
        sums[2 * k] += loss[k];
        sums[2 * k + 1] += static_cast<double>(correct[k]);
      }
      if (slow) Straggle(t0, straggler.factor);
      comm.AllreduceSum(grad.data(), grad.size());
      for (auto& per_head : opts)
        for (kernels::Optimizer& o : per_head) o.Step(params.data() + o.lo(), grad.data() + o.lo());
      tail.Add(++updates, params.data(), params.size());
    }
    comm.AllreduceSum(sums.data(), sums.size());
    for (size_t k = 0; k < K; ++k)
      heads[k]->curve.push_back({updates, clock.Seconds(), sums[2 * k] / static_cast<double>(n),
                                 sums[2 * k + 1] / static_cast<double>(n)});
  }
  tail.Finish(params.data(), params.size());
  kernel.Unpack(params.data(), heads);
  std::vector<TrainStats> out(K);
  for (TrainStats& st : out) {
    st.mode = "sync";
    st.ranks = N;
    st.updates = updates;
    st.seconds = clock.Seconds();
    st.together = static_cast<int64_t>(K);
  }
  return out;
}

}  // namespace msaflow::parallel
