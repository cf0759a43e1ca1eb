// Async and hybrid training with parameter servers (parallel/train.h; message pattern in
// docs/parallel.md).
#include <algorithm>
#include <cstring>
#include <deque>
#include <numeric>
#include <random>

#include "common/error.h"
#include "parallel/train.h"
#include "parallel/train_util.h"

namespace msaflow::parallel {
namespace {

constexpr int kTagGrad = 101, kTagReply = 102, kTagDone = 103, kTagFinal = 104;

struct GradHeader {
  int64_t version;  // the server slice's version the gradient was computed from
  int64_t rows;
  double loss;      // summed over the rows
  int64_t correct;
};
struct ReplyHeader {
  int64_t version;
  int32_t accepted;
  int32_t stop;
};
struct FinalHeader {
  double staleness_sum;
  int64_t accepted, staleness_max, refused;
};

template <typename H>
std::string Pack(const H& h, const float* data, size_t n) {
  std::string b(sizeof h + n * sizeof(float), '\0');
  std::memcpy(b.data(), &h, sizeof h);
  if (n) std::memcpy(b.data() + sizeof h, data, n * sizeof(float));
  return b;
}

template <typename H>
H Unpack(const std::string& b, float* data, size_t n, int from) {
  if (b.size() != sizeof(H) + n * sizeof(float))
    Throw(ErrorKind::kCorrupt, "parameter server: message of " + std::to_string(b.size()) + " bytes from rank " +
                                   std::to_string(from) + ", expected " + std::to_string(sizeof(H) + n * sizeof(float)));
  H h;
  std::memcpy(&h, b.data(), sizeof h);
  if (n) std::memcpy(data, b.data() + sizeof h, n * sizeof(float));
  return h;
}

struct Layout {
  int S = 1, W = 1, U = 1, team = 1;  // servers, workers, units (workers or groups), workers per unit
  size_t P = 0;
  size_t Lo(int s) const { return P * static_cast<size_t>(s) / static_cast<size_t>(S); }
  size_t Hi(int s) const { return Lo(s + 1); }
  int UnitOf(int world_rank) const { return (world_rank - S) / team; }
  int Leader(int unit) const { return S + unit * team; }
};

// A server's optimisers: the head's over its part of [lo, hi), and one over the tail's part at
// the tail's learning rate, without L2.
class SliceOptimizer {
 public:
  SliceOptimizer(const PsModel& m, size_t lo, size_t hi, float momentum) {
    const kernels::HeadConfig& cfg = m.h->config;
    if (lo < m.head_size)
      parts_.emplace_back(kernels::Optimizer(cfg, kernels::ParamLayout(cfg, m.h->in_dim, m.h->classes), lo,
                                             std::min(hi, m.head_size), momentum),
                          0);
    if (hi > m.head_size) {
      const kernels::HeadConfig tail = TailConfig(cfg, m.tail_lr_scale);
      const size_t from = std::max(lo, m.head_size), T = m.P - m.head_size;
      parts_.emplace_back(
          kernels::Optimizer(tail, {kernels::ParamBlock{0, T, false}}, from - m.head_size, hi - m.head_size, momentum),
          from - lo);
    }
  }
  // params and grad point at element lo.
  void Step(float* params, const float* grad) {
    for (auto& [o, at] : parts_) o.Step(params + at, grad + at);
  }

 private:
  std::vector<std::pair<kernels::Optimizer, size_t>> parts_;  // and where each starts in the slice
};

TrainStats Serve(Comm& world, const Layout& L, PsModel& m, const PsOptions& opt, workflow::TrainMode mode) {
  const int s = world.rank();
  const size_t lo = L.Lo(s), hi = L.Hi(s), len = hi - lo;
  kernels::Head* h = m.h;
  const kernels::HeadConfig& cfg = h->config;
  const int64_t steps_per_epoch = (m.n + cfg.batch - 1) / cfg.batch;
  const int64_t budget = cfg.epochs * steps_per_epoch;
  // Asynchrony acts as momentum of about 1 - 1/units (Mitliagkas et al., "Asynchrony begets
  // momentum", 2016): the optimiser's own momentum is lowered by as much, so the total stays
  // what one worker would have.
  const float implicit = 1.f - 1.f / static_cast<float>(L.U);
  SliceOptimizer optim(m, lo, hi, std::max(0.f, kernels::kMomentum - implicit));
  std::vector<float> grad(len);
  float* params = m.params + lo;
  TailAverage tail(budget, steps_per_epoch, cfg.epochs);
  TrainStats st;
  st.mode = mode;
  st.updates_per_worker.assign(static_cast<size_t>(L.U), 0);
  st.refused_per_worker.assign(static_cast<size_t>(L.U), 0);
  int64_t version = 0, accepted = 0, stale_max = 0;
  double stale_sum = 0, win_loss = 0, win_correct = 0, win_rows = 0;
  int active = L.U;
  std::string msg;
  world.Barrier();  // the workers' start line (Work): no gradient comes before every worker has one
  Stopwatch watch;
  while (active > 0) {
    int tag = 0;
    // Server 0 decides when training ends and never sees DONE; the others serve until every
    // unit has said it is done.
    int from = world.Recv(kAnySource, s == 0 ? kTagGrad : kAnyTag, &msg, &tag);
    int u = L.UnitOf(from);
    if (tag == kTagDone) {
      --active;
      continue;
    }
    GradHeader g = Unpack<GradHeader>(msg, grad.data(), len, from);
    ReplyHeader rep{version, 0, 0};
    int64_t stale = version - g.version;
    if (s == 0 && accepted >= budget) {
      rep.stop = 1;
    } else if (stale > opt.max_staleness) {
      ++st.refused_per_worker[static_cast<size_t>(u)];
    } else {
      // A gradient staler than the units' round trip (units - 1 updates) is damped in proportion
      // (staleness-aware steps, Zhang et al., IJCAI 2016), so a late straggler cannot undo
      // the others' progress; the usual staleness is applied at full weight.
      if (stale >= L.U) {
        const float damp = static_cast<float>(L.U) / static_cast<float>(stale + 1);
        for (auto& g : grad) g *= damp;
      }
      optim.Step(params, grad.data());
      tail.Add(version + 1, params, len);
      rep.version = ++version;
      rep.accepted = 1;
      ++accepted;
      ++st.updates_per_worker[static_cast<size_t>(u)];
      stale_sum += static_cast<double>(stale);
      stale_max = std::max(stale_max, stale);
      win_loss += g.loss;
      win_correct += static_cast<double>(g.correct);
      win_rows += static_cast<double>(g.rows);
      if (s == 0 && accepted % steps_per_epoch == 0) {
        h->curve.push_back({accepted, watch.Seconds(), win_loss / win_rows, win_correct / win_rows});
        win_loss = win_correct = win_rows = 0;
      }
      if (s == 0 && accepted >= budget) rep.stop = 1;
    }
    world.Post(from, kTagReply, Pack(rep, params, len));  // on to the next worker's gradient at once
    if (rep.stop) --active;
  }
  world.Flush();
  tail.Finish(params, len);
  st.updates = accepted;
  st.staleness_max = stale_max;
  int64_t refused = std::accumulate(st.refused_per_worker.begin(), st.refused_per_worker.end(), int64_t{0});
  FinalHeader mine{stale_sum, accepted, stale_max, refused};
  if (s != 0) {
    world.Send(0, kTagFinal, Pack(mine, params, len));
    return st;
  }
  // Server 0 assembles the parameters and the staleness seen by every server.
  double sum = stale_sum;
  int64_t count = accepted;
  st.refused = refused;
  for (int k = 1; k < L.S; ++k) {
    world.Recv(k, kTagFinal, &msg, nullptr);
    FinalHeader f = Unpack<FinalHeader>(msg, m.params + L.Lo(k), L.Hi(k) - L.Lo(k), k);
    sum += f.staleness_sum;
    count += f.accepted;
    st.staleness_max = std::max(st.staleness_max, f.staleness_max);
    st.refused += f.refused;
  }
  st.staleness_mean = count ? sum / static_cast<double>(count) : 0;
  st.seconds = watch.Seconds();
  return st;
}

// A worker: computes its part of its unit's batch; the unit's leader exchanges the unit's
// gradient with every server and hands the fresh weights to its unit.
void Work(Comm& world, Comm& team, const Layout& L, PsModel& m, const PsOptions& opt) {
  const int me = world.rank(), unit = L.UnitOf(me), member = team.rank();
  const bool leader = member == 0;
  const kernels::HeadConfig& cfg = m.h->config;
  const int64_t first = m.n * unit / L.U, shard = m.n * (unit + 1) / L.U - first;
  if (shard < 1)
    Throw(ErrorKind::kInvalidInput,
          "train: " + std::to_string(m.n) + " rows cannot be shared by " + std::to_string(L.U) + " workers or groups");
  const int64_t b = std::min(cfg.batch, shard);
  std::vector<int64_t> rows(static_cast<size_t>(shard));
  std::iota(rows.begin(), rows.end(), first);
  std::mt19937_64 rng(ShuffleSeed(cfg.data_seed, static_cast<uint64_t>(unit) + 1));
  auto shuffle = [&] {
    if (m.shuffle)
      m.shuffle(rows, rng);
    else
      std::shuffle(rows.begin(), rows.end(), rng);
  };
  shuffle();
  size_t pos = 0;
  const int64_t part_lo = b * member / team.size(), part_hi = b * (member + 1) / team.size();
  // The unit's batches drawn ahead, a pass over its shard at a time (the same draws as one at a
  // time), so that m.expect learns this member's rows of them before they are computed.
  std::deque<std::vector<int64_t>> ahead;
  auto draw_pass = [&] {
    bool reshuffled = false;
    do {
      std::vector<int64_t> batch_rows(static_cast<size_t>(b));
      for (int64_t i = 0; i < b; ++i) {  // the unit's next batch from its shard, reshuffled at each pass
        if (pos == rows.size()) {
          shuffle();
          pos = 0;
          reshuffled = true;
        }
        batch_rows[static_cast<size_t>(i)] = rows[pos++];
      }
      if (m.expect) m.expect(batch_rows.data() + part_lo, part_hi - part_lo);
      ahead.push_back(std::move(batch_rows));
    } while (pos < rows.size() && !reshuffled);
  };
  // The gradient with the batch's loss and hits behind it, so a group sums them in one go
  // (an allreduce: Open MPI's nonblocking reduce to one rank was 1.7x slower here);
  // the weights with the stop flag behind them, so a group broadcasts them in one go.
  std::vector<float> grad(L.P + 2), weights(L.P + 1);
  std::vector<int64_t> versions(static_cast<size_t>(L.S), 0);
  const bool slow = opt.straggler.rank == me - L.S && opt.straggler.factor > 1;
  int64_t steps = 0;
  std::string msg;
  auto next_gradient = [&] {
    if (ahead.empty()) draw_pass();
    const std::vector<int64_t> batch_rows = std::move(ahead.front());
    ahead.pop_front();
    std::fill(grad.begin(), grad.end(), 0.f);
    int64_t correct = 0;
    grad[L.P] =
        static_cast<float>(m.gradient(batch_rows.data() + part_lo, part_hi - part_lo, b, grad.data(), &correct));
    grad[L.P + 1] = static_cast<float>(correct);
    if (team.size() > 1) team.AllreduceSum(grad.data(), grad.size());
  };
  // Every worker computes its first gradient (which carries the GEMM kernels' generation)
  // before any is sent: the race starts level. Without this line, on oversubscribed cores one
  // worker was seen to take 637 of 640 updates while the others were still warming up.
  auto t0 = std::chrono::steady_clock::now();
  next_gradient();
  world.Barrier();
  for (;;) {
    float stop = 0;
    if (leader) {
      for (int s = 0; s < L.S; ++s) {
        GradHeader g{versions[static_cast<size_t>(s)], b, grad[L.P], static_cast<int64_t>(grad[L.P + 1])};
        world.Post(s, kTagGrad, Pack(g, grad.data() + L.Lo(s), L.Hi(s) - L.Lo(s)));
      }
      for (int s = 0; s < L.S; ++s) {
        world.Recv(s, kTagReply, &msg, nullptr);
        ReplyHeader r = Unpack<ReplyHeader>(msg, m.params + L.Lo(s), L.Hi(s) - L.Lo(s), s);
        versions[static_cast<size_t>(s)] = r.version;
        if (s == 0 && r.stop) stop = 1.f;
      }
      if (stop != 0.f) {
        for (int s = 1; s < L.S; ++s) world.Post(s, kTagDone, "");
        world.Flush();
      }
    }
    if (team.size() > 1) {
      if (leader) std::copy(m.params, m.params + L.P, weights.begin());
      weights[L.P] = stop;
      team.Bcast(weights.data(), weights.size() * sizeof(float), 0);
      stop = weights[L.P];
      if (!leader) std::copy(weights.begin(), weights.begin() + static_cast<ptrdiff_t>(L.P), m.params);
    }
    if (stop != 0) return;
    // The first step carries the warm-up (the GEMM kernels' generation, the first messages),
    // which a slow node would not multiply; a multiple of it was seen to outlast a whole run.
    if (slow && ++steps > 1) Straggle(t0, opt.straggler.factor);
    t0 = std::chrono::steady_clock::now();
    next_gradient();
  }
}

}  // namespace

TrainStats TrainWithServers(Comm& world, PsModel& m, const PsOptions& opt) {
  Layout L;
  L.S = static_cast<int>(opt.servers);
  L.W = world.size() - L.S;
  L.P = m.P;
  const workflow::TrainMode mode = opt.groups > 0 ? workflow::TrainMode::kHybrid : workflow::TrainMode::kAsync;
  if (L.S < 1 || L.W < 1 || (opt.groups > 0 && L.W % opt.groups != 0) || static_cast<size_t>(L.S) > L.P)
    Throw(ErrorKind::kInvalidInput, std::string("train: mode ") + workflow::TrainModeName(mode) + " with " + std::to_string(opt.servers) +
                                        " server(s) and " + std::to_string(opt.groups) + " group(s) cannot run on " +
                                        std::to_string(world.size()) + " ranks");
  L.U = opt.groups > 0 ? static_cast<int>(opt.groups) : L.W;
  L.team = L.W / L.U;
  const bool server = world.rank() < L.S;
  auto team = world.Split(server ? 0 : 1 + L.UnitOf(world.rank()), world.rank());
  TrainStats st;
  if (server) {
    st = Serve(world, L, m, opt, mode);
  } else {
    Work(world, *team, L, m, opt);
    st.mode = mode;
  }
  st.ranks = L.W;
  st.servers = L.S;
  st.groups = opt.groups > 0 ? L.U : 1;
  return st;
}

TrainStats TrainParameterServer(Comm& world, const TrainData& data, kernels::Head* h, const PsOptions& opt) {
  const int64_t dim = h->in_dim;
  BatchBuffer batch(h->config.batch, dim);
  kernels::GradientKernel kernel(*h, h->config.batch);
  PsModel m;
  m.h = h;
  m.n = data.n;
  m.params = h->params.data();
  m.P = m.head_size = h->params.size();
  m.gradient = [&](const int64_t* rows, int64_t count, int64_t b, float* grad, int64_t* correct) {
    batch.Gather(data, rows, count, dim);
    return kernel.Accumulate(*h, batch.x.data(), batch.y.data(), count, 1.f / static_cast<float>(b), grad, correct);
  };
  return TrainWithServers(world, m, opt);
}

}  // namespace msaflow::parallel
