#include <omp.h>

#include <algorithm>
#include <exception>
#include <functional>
#include <memory>
#include <chrono>
#include <numeric>
#include <random>
#include <thread>

#include "common/error.h"
#include "kernels/head_batch.h"
#include "parallel/sync_batches.h"
#include "parallel/train.h"
#include "parallel/train_util.h"

namespace msaflow::parallel {

nlohmann::json TrainStats::ToJson() const {
  nlohmann::json j = {{"mode", workflow::TrainModeName(mode)},
                      {"ranks", ranks},
                      {"servers", servers},
                      {"groups", groups},
                      {"updates", updates},
                      {"seconds", seconds}};
  if (workflow::UsesParameterServers(mode)) {
    const bool hybrid = workflow::HasGroups(mode);
    j["refused"] = refused;
    j["staleness"] = {{"mean", staleness_mean}, {"max", staleness_max}};
    j[hybrid ? "updates_per_group" : "updates_per_worker"] = updates_per_worker;
    j[hybrid ? "refused_per_group" : "refused_per_worker"] = refused_per_worker;
  }
  if (!solver.is_null()) j["solver"] = solver;
  if (together > 1) j["trained_together"] = together;
  if (buckets > 0) j["allreduce"] = {{"buckets", buckets}, {"wait_s", wait_seconds}};
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

namespace {

// The heads of one thread of TrainSyncTogether: a HeadBatch of its own, with its parameter
// vector, gradient, optimisers and tail average.
struct Part {
  std::vector<size_t> members;  // positions in the heads trained together
  std::unique_ptr<kernels::HeadBatch> kernel;
  std::vector<float> params, grad;
  std::vector<std::vector<kernels::Optimizer>> opts;  // per member, per block
  std::unique_ptr<TailAverage> tail;
  std::vector<double> loss;
  std::vector<int64_t> correct;
  std::exception_ptr error;
};

// The heads dealt to `parts` threads by first-layer width (the GEMMs' share), widest first onto
// the least loaded; each part keeps the heads' order.
std::vector<std::vector<size_t>> Deal(const std::vector<kernels::Head*>& heads, size_t parts) {
  std::vector<size_t> order(heads.size());
  std::iota(order.begin(), order.end(), 0);
  auto width = [&](size_t k) { return heads[k]->config.type == "mlp" ? heads[k]->config.hidden : heads[k]->classes; };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return width(a) > width(b); });
  std::vector<std::vector<size_t>> out(parts);
  std::vector<int64_t> load(parts, 0);
  for (size_t k : order) {
    const size_t p = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    out[p].push_back(k);
    load[p] += width(k);
  }
  for (auto& o : out) std::sort(o.begin(), o.end());
  return out;
}

// Sets the OpenMP threads of this thread's next parallel regions, and restores them.
class OmpThreads {
 public:
  explicit OmpThreads(int n) : saved_(omp_get_max_threads()) { omp_set_num_threads(n); }
  ~OmpThreads() { omp_set_num_threads(saved_); }

 private:
  int saved_;
};

// The heads dealt into T parts, one per thread: each part's batched kernel, its packed
// parameters and gradient, an optimiser per head and block, and its tail average.
std::vector<Part> MakeParts(const std::vector<kernels::Head*>& heads, size_t T, int64_t max_rows, int64_t budget,
                            int64_t per_epoch, int64_t epochs) {
  std::vector<Part> parts(T);
  const auto dealt = Deal(heads, T);
  for (size_t p = 0; p < T; ++p) {
    Part& q = parts[p];
    q.members = dealt[p];
    std::vector<const kernels::Head*> hs;
    for (size_t k : q.members) hs.push_back(heads[k]);
    q.kernel = std::make_unique<kernels::HeadBatch>(hs, max_rows);
    q.params.resize(q.kernel->size());
    q.grad.resize(q.kernel->size());
    q.kernel->Pack(hs, q.params.data());
    // Each head's own optimiser (its lr, l2, algorithm) over each of its blocks in the vector.
    q.opts.resize(hs.size());
    for (size_t m = 0; m < hs.size(); ++m)
      for (const kernels::ParamBlock& blk : q.kernel->Blocks(m))
        q.opts[m].emplace_back(hs[m]->config, std::vector<kernels::ParamBlock>{blk}, blk.offset, blk.offset + blk.size);
    q.tail = std::make_unique<TailAverage>(budget, per_epoch, epochs);
    q.loss.resize(hs.size());
    q.correct.resize(hs.size());
  }
  return parts;
}

// The parts' tail-averaged parameters back into their heads.
void FinishParts(std::vector<Part>& parts, const std::vector<kernels::Head*>& heads) {
  for (Part& q : parts) {
    q.tail->Finish(q.params.data(), q.params.size());
    std::vector<kernels::Head*> hs;
    for (size_t k : q.members) hs.push_back(heads[k]);
    q.kernel->Unpack(q.params.data(), hs);
  }
}

}  // namespace

std::vector<TrainStats> TrainSyncTogether(Comm& comm, const TrainData& data, const std::vector<kernels::Head*>& heads,
                                          const Straggler& straggler) {
  for (const kernels::Head* h : heads)
    if (!CanTrainTogether(*heads[0], *h))
      Throw(ErrorKind::kInternal, "TrainSyncTogether: heads that cannot be trained together");
  const kernels::HeadConfig& cfg = heads[0]->config;
  const int64_t n = data.n, dim = heads[0]->in_dim, B = cfg.batch;
  const size_t K = heads.size();
  const int N = comm.size(), r = comm.rank();
  Stopwatch watch;
  SyncBatches batches(data, dim, B, cfg.epochs, cfg.data_seed, r, N);
  const int64_t max_rows = batches.max_rows();
  const int64_t per_epoch = batches.per_epoch();
  // The rank's threads share out the heads, each thread running its heads' GEMMs on its own:
  // a batch's GEMMs (tens of rows) are too small to split between threads (measured: 2
  // threads on one such GEMM are slower than 1), whole heads are not.
  // Every rank must split the heads alike (one allreduce per part), so rank 0's thread count
  // decides: ranks on nodes with other core counts or rank placements follow it.
  const int local_threads = std::max(1, omp_get_max_threads());
  int threads = local_threads;
  if (N > 1) comm.Bcast(&threads, sizeof threads, 0);
  const size_t T = std::min(K, static_cast<size_t>(threads));
  OmpThreads single(1);
  std::vector<Part> parts = MakeParts(heads, T, max_rows, per_epoch * cfg.epochs, per_epoch, cfg.epochs);
  // Runs f on every part and `beside` (if given) as one more piece of work, on a thread each
  // where the rank has one to spare (else `beside` goes to the first thread done with its
  // part); the first error is rethrown here. Which thread runs a part does not change its
  // result: its GEMMs run on that one thread.
  std::exception_ptr beside_error;
  auto each_part = [&](auto&& f, const std::function<void()>& beside = {}) {
    const size_t work = T + (beside ? 1 : 0);
    const int threads_here = static_cast<int>(std::min(work, std::max(static_cast<size_t>(local_threads), T)));
#pragma omp parallel for num_threads(threads_here) schedule(dynamic, 1)
    for (size_t p = 0; p < work; ++p) {
      try {
        if (p < T) f(parts[p]);
        else beside();
      } catch (...) {
        (p < T ? parts[p].error : beside_error) = std::current_exception();
      }
    }
    if (beside_error) std::rethrow_exception(beside_error);
    for (Part& q : parts)
      if (q.error) std::rethrow_exception(q.error);
  };
  const bool slow = straggler.rank == r && straggler.factor > 1;
  int64_t updates = 0;
  std::vector<double> sums(2 * K);  // per head: loss, correct
  if (batches.steps() > 0) batches.Gather(0);
  for (int64_t e = 0; e < cfg.epochs; ++e) {
    std::fill(sums.begin(), sums.end(), 0.0);
    for (int64_t t = e * per_epoch; t < (e + 1) * per_epoch; ++t) {
      auto t0 = std::chrono::steady_clock::now();
      const int64_t b = batches.Whole(t), rows = batches.Rows(t);
      const BatchBuffer& batch = batches.Buffer(t);
      const std::function<void()> gather_next = [&] {
        if (t + 1 < batches.steps()) batches.Gather(t + 1);
      };
      auto accumulate = [&](Part& q) {
        std::fill(q.grad.begin(), q.grad.end(), 0.f);
        std::fill(q.loss.begin(), q.loss.end(), 0.0);
        std::fill(q.correct.begin(), q.correct.end(), 0);
        q.kernel->Accumulate(q.params.data(), batch.x.data(), batch.y.data(), rows, 1.f / static_cast<float>(b),
                             q.grad.data(), q.loss.data(), q.correct.data());
      };
      each_part(accumulate, gather_next);  // the next batch is gathered while this one trains
      for (const Part& q : parts)
        for (size_t m = 0; m < q.members.size(); ++m) {
          sums[2 * q.members[m]] += q.loss[m];
          sums[2 * q.members[m] + 1] += static_cast<double>(q.correct[m]);
        }
      if (slow && updates > 0) Straggle(t0, straggler.factor);  // not the warm-up step (train_ps.cc)
      for (Part& q : parts) comm.AllreduceSum(q.grad.data(), q.grad.size());  // MPI from this thread only
      ++updates;
      auto step = [&](Part& q) {
        for (auto& per_head : q.opts)
          for (kernels::Optimizer& o : per_head) o.Step(q.params.data() + o.lo(), q.grad.data() + o.lo());
        q.tail->Add(updates, q.params.data(), q.params.size());
      };
      each_part(step);
    }
    comm.AllreduceSum(sums.data(), sums.size());
    for (size_t k = 0; k < K; ++k)
      heads[k]->curve.push_back(
          {updates, watch.Seconds(), sums[2 * k] / static_cast<double>(n), sums[2 * k + 1] / static_cast<double>(n)});
  }
  FinishParts(parts, heads);
  std::vector<TrainStats> out(K);
  for (TrainStats& st : out) {
    st.mode = workflow::TrainMode::kSync;
    st.ranks = N;
    st.updates = updates;
    st.seconds = watch.Seconds();
    st.together = static_cast<int64_t>(K);
  }
  return out;
}

}  // namespace msaflow::parallel
