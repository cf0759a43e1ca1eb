// Step 2b (DAM): every candidate head trained on its backbone's features, staged in the NAM
// for the store step. How the ranks share the work is the task's train layout
// (docs/parallel.md): independent ranks deal the candidates out and train alone; sync, async
// and hybrid train each candidate in turn with all ranks, and rank 0 stages it.
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>

#include "common/error.h"
#include "modules/features.h"
#include "modules/finetune_maps.h"
#include "modules/model_object.h"
#include "modules/straggler.h"
#include "parallel/train.h"
#include "workflow/backbones.h"
#include "workflow/objects.h"

namespace msaflow::modules {
namespace {

// A model's training curve, as its metadata keeps it: every point up to kMaxCurvePoints, else
// that many spread evenly over the training, the first and last always in ("epoch" says which
// point each is, 1-based). The metadata must fit the NAM's 16 KiB at 10,000 epochs too.
constexpr size_t kMaxCurvePoints = 100;

nlohmann::json CurveJson(const kernels::Head& h) {
  nlohmann::json c = {{"epoch", nlohmann::json::array()},
                      {"step", nlohmann::json::array()},
                      {"seconds", nlohmann::json::array()},
                      {"loss", nlohmann::json::array()},
                      {"train_accuracy", nlohmann::json::array()}};
  const size_t n = h.curve.size(), keep = std::min(n, kMaxCurvePoints);
  for (size_t j = 0; j < keep; ++j) {
    const size_t i = keep == n ? j : (j * (n - 1) + (keep - 1) / 2) / (keep - 1);  // rounded, ascending
    const auto& p = h.curve[i];
    c["epoch"].push_back(i + 1);
    c["step"].push_back(p.step);
    c["seconds"].push_back(p.seconds);
    c["loss"].push_back(p.loss);
    c["train_accuracy"].push_back(p.accuracy);
  }
  return c;
}

kernels::Head StartingHead(StepContext& c, const workflow::Candidate& cand, const Features& f) {
  std::unique_ptr<kernels::Head> init;
  if (!cand.warm_start.empty()) {
    nam::Object m = c.store->Get(cand.warm_start);
    try {
      init = std::make_unique<kernels::Head>(
          HeadFromModel(m, workflow::CandidateFromJson(m.info.meta.at("candidate")).head));
    } catch (const nlohmann::json::exception& e) {
      Throw(ErrorKind::kCorrupt, "NAM object '" + m.info.name + "': model metadata: " + e.what());
    }
  }
  return kernels::InitHead(cand.head, f.x.data(), f.labels.data(), f.n, f.dim, f.classes, init.get());
}

void Stage(StepContext& c, const workflow::Candidate& cand, const Features& f, const kernels::Head& h,
           const parallel::TrainStats& st, const kernels::Tail* tail = nullptr) {
  const auto& bb = c.pipeline().Backbone(cand.backbone);
  nlohmann::json meta = {{"candidate", workflow::ToJson(cand)},
                         {"in_dim", h.in_dim},
                         {"classes", h.classes},
                         {"backbone", cand.backbone},
                         {"backbone_digest", BackboneDigest(*c.store, bb)},
                         {"curve", CurveJson(h)},
                         {"seconds", st.seconds},
                         {"weights_layout", kernels::kWeightsLayout},
                         {"train_rows", f.n},
                         {"training", st.ToJson()}};
  const std::string bytes = ModelBytes(h, tail, bb.train_from, &meta);
  c.store->Put(workflow::StagingObject(c.task.run, c.task.round, cand.id), bytes, meta);
  using workflow::TrainMode;
  std::string how = !workflow::RanksShareModels(st.mode) || st.ranks == 1
                        ? ""
                        : fmt::format(" [{} on {} ranks", workflow::TrainModeName(st.mode), st.ranks);
  if (!how.empty() && st.servers) how += fmt::format(" + {} server(s)", st.servers);
  if (workflow::HasGroups(st.mode)) how += fmt::format(", {} groups", st.groups);
  if (workflow::UsesParameterServers(st.mode))
    how += fmt::format(", staleness mean {:.2f} max {}, {} refused", st.staleness_mean, st.staleness_max, st.refused);
  if (!how.empty()) how += "]";
  if (tail)
    how += fmt::format(" [fine-tuned from {}: {} weights at lr x {}]", bb.train_from, tail->ParamCount(),
                       cand.backbone_lr_scale);
  c.Say(fmt::format("trained {} ({} on {}): final train loss {:.4f}, train acc {:.4f} in {:.1f} s{}{}", cand.id,
                    workflow::HeadLabel(cand.head), cand.backbone, h.curve.back().loss, h.curve.back().accuracy,
                    st.seconds, how + (st.together > 1 ? fmt::format(" (one of {} trained together)", st.together) : ""),
                    cand.warm_start.empty() ? "" : " (warm start from " + cand.warm_start + ")"));
}

// Mode independent: which rank trains each candidate. Longest first onto the least loaded rank
// (ties: smaller candidate index, lower rank), by the estimated cost epochs x rows x weights —
// candidates differ several-fold (an MLP on 784 pixels against a softmax on 480 features), so
// dealing them round-robin would leave ranks idle. Every rank computes the same answer.
std::vector<int> DealByCost(const std::vector<workflow::Candidate>& cands, const std::map<std::string, FeaturesIndex>& feats,
                            int ranks) {
  std::vector<double> cost(cands.size());
  for (size_t i = 0; i < cands.size(); ++i) {
    const FeaturesIndex& f = feats.at(cands[i].backbone);
    const auto& h = cands[i].head;
    double weights = h.type == "mlp" ? static_cast<double>(f.dim * h.hidden + h.hidden * f.classes)
                                     : static_cast<double>(f.dim * f.classes);
    cost[i] = static_cast<double>(h.epochs) * static_cast<double>(f.n) * weights;
  }
  std::vector<size_t> order(cands.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return cost[a] > cost[b]; });
  std::vector<double> load(static_cast<size_t>(ranks), 0);
  std::vector<int> owner(cands.size(), 0);
  for (size_t i : order) {
    int r = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    owner[i] = r;
    load[static_cast<size_t>(r)] += cost[i];
  }
  return owner;
}

}  // namespace

namespace {

using workflow::TrainMode;
// Stages a trained head and notes it for the step's summary.
using Stager = std::function<void(const workflow::Candidate&, const Features&, const kernels::Head&,
                                  const parallel::TrainStats&, const kernels::Tail*)>;
// Notes a candidate an earlier attempt of the step staged (its staging object's info).
using Reuser = std::function<void(const workflow::Candidate&, const nam::ObjectInfo&)>;

// Mode independent on several ranks: which rank trains each candidate (DealByCost), said per rank.
std::vector<int> DealCandidates(StepContext& c, const std::vector<workflow::Candidate>& cands) {
  parallel::Comm& world = *c.comm;
  std::map<std::string, FeaturesIndex> shapes;  // metadata only: a rank reads only its own candidates' features
  for (const auto& cand : cands)
    if (!shapes.count(cand.backbone)) shapes[cand.backbone] = FeaturesShape(c, cand.backbone, "train");
  std::vector<int> owner = DealByCost(cands, shapes, world.size());
  std::string dealt;
  for (size_t i = 0; i < cands.size(); ++i)
    if (owner[i] == world.rank()) dealt += (dealt.empty() ? "" : ", ") + cands[i].id;
  c.Say("candidates dealt by estimated cost: " + (dealt.empty() ? std::string("none") : dealt));
  return owner;
}

// The parameter servers' options of the task's layout (async: every worker on its own).
parallel::PsOptions PsOptionsOf(const workflow::TrainLayout& layout, const parallel::Straggler& straggler) {
  return {layout.servers, workflow::HasGroups(layout.mode) ? layout.groups : 0, layout.max_staleness, straggler};
}

// Modes async and hybrid: every head candidate (not fine-tuning) in turn on all processes, workers and servers.
void TrainWithServers(StepContext& c, const std::vector<workflow::Candidate>& cands,
                      const parallel::Straggler& straggler, std::map<std::string, Features>& cache,
                      const Stager& staged) {
  const workflow::TrainLayout& layout = c.task.train;
  parallel::Comm& world = *c.comm;
  for (const workflow::Candidate& cand : cands) {
    if (!cache.count(cand.backbone)) cache[cand.backbone] = LoadFeatures(c, cand.backbone, "train");
    const Features& f = cache[cand.backbone];
    kernels::Head h = StartingHead(c, cand, f);
    const parallel::PsOptions opt = PsOptionsOf(layout, straggler);
    // Raw features, standardised as the batches are gathered (no standardised copy).
    const parallel::TrainData data{f.x.data(), f.labels.data(), f.n, h.mean.data(), h.inv_std.data()};
    const parallel::TrainStats st = parallel::TrainParameterServer(world, data, &h, opt);
    if (world.rank() == 0) staged(cand, f, h, st, nullptr);
  }
}

// Modes independent and sync: this rank's candidates (`owner`), in batches of heads that train
// together (one GEMM per step serves a whole batch; parallel/train.h).
void TrainInBatches(StepContext& c, const std::vector<workflow::Candidate>& cands, const std::vector<int>& owner,
                    const parallel::Straggler& straggler, std::map<std::string, Features>& cache,
                    const Stager& staged) {
  const bool alone = !workflow::RanksShareModels(c.task.train.mode);  // independent: else sync
  parallel::Comm& world = *c.comm;
  std::vector<size_t> mine;
  for (size_t i = 0; i < cands.size(); ++i)
    if (owner[i] == world.rank()) mine.push_back(i);
  std::vector<kernels::Head> heads;
  std::vector<std::vector<size_t>> batches;  // positions in `mine`
  for (size_t k = 0; k < mine.size(); ++k) {
    const workflow::Candidate& cand = cands[mine[k]];
    if (!cache.count(cand.backbone)) cache[cand.backbone] = LoadFeatures(c, cand.backbone, "train");
    heads.push_back(StartingHead(c, cand, cache[cand.backbone]));
    auto fits = [&](const std::vector<size_t>& b) {
      return cands[mine[b[0]]].backbone == cand.backbone && parallel::CanTrainTogether(heads[b[0]], heads[k]);
    };
    auto it = std::find_if(batches.begin(), batches.end(), fits);
    if (it == batches.end()) batches.push_back({k});
    else it->push_back(k);
  }
  parallel::SelfComm self;
  parallel::Comm& comm = alone ? static_cast<parallel::Comm&>(self) : world;
  const parallel::Straggler slow = !alone                           ? straggler
                                   : world.rank() == straggler.rank ? parallel::Straggler{0, straggler.factor}
                                                                    : parallel::Straggler{};
  for (const std::vector<size_t>& b : batches) {
    const Features& f = cache[cands[mine[b[0]]].backbone];
    // Raw features, standardised as the batches are gathered (no standardised copy); the heads
    // of a batch share their standardisation (CanTrainTogether).
    const kernels::Head& first = heads[b[0]];
    const parallel::TrainData data{f.x.data(), f.labels.data(), f.n, first.mean.data(), first.inv_std.data()};
    std::vector<kernels::Head*> members;
    members.reserve(b.size());
    for (size_t k : b) members.push_back(&heads[k]);
    std::vector<parallel::TrainStats> stats;
    if (members.size() == 1) {
      stats.push_back(parallel::TrainSync(comm, data, members[0], slow));
    } else {
      std::string ids;
      for (size_t k : b) ids += (ids.empty() ? "" : ", ") + cands[mine[k]].id;
      if (alone || c.root())
        c.Say(fmt::format("training {} heads together on {} features: {}", b.size(), cands[mine[b[0]]].backbone, ids));
      stats = parallel::TrainSyncTogether(comm, data, members, slow);
    }
    if (!alone && world.rank() != 0) continue;  // rank 0 stages
    for (size_t m = 0; m < b.size(); ++m) {
      if (alone) stats[m].mode = TrainMode::kIndependent;
      staged(cands[mine[b[m]]], f, heads[b[m]], stats[m], nullptr);
    }
  }
}

// Fine-tuning candidates (docs/finetune.md): each on all ranks in turn (sync, async and hybrid;
// rank 0 stages), or dealt over the ranks in turn, each training alone (independent). A candidate's tail starts from
// the backbone's weights, or its warm start's tail where that model was fine-tuned; its head
// from its warm start, or initialised on the tail's features of the training maps.
// A fine-tuning candidate that an earlier attempt of this step staged already (the step was killed
// or failed after it): its staging object, if that holds this very candidate, else nothing. A
// resumed round plans the same candidates, so a rerun trains only what is missing: fine-tuning a
// candidate takes minutes where a head takes a second.
std::optional<nam::ObjectInfo> StagedBefore(StepContext& c, const workflow::Candidate& cand) {
  auto info = c.store->Stat(workflow::StagingObject(c.task.run, c.task.round, cand.id));
  if (!info || !info->meta.contains("candidate") || info->meta["candidate"] != workflow::ToJson(cand) ||
      !info->meta.contains("tail"))  // a fine-tuned model, not a head staged alone
    return {};
  return info;
}

// The training maps of `bb`: held whole where they fit beside the tail's activations for the
// largest batch of its candidates in the rank's memory (TrainLayout::rank_memory), else streamed.
std::unique_ptr<MapsSource> TrainingMaps(StepContext& c, const workflow::BackboneSpec& bb, kernels::Tail& tail,
                                         const std::vector<workflow::Candidate>& cands, bool alone) {
  std::unique_ptr<MapsSource> whole = OpenMaps(c, bb, "train", 0);
  int64_t batch = 1;
  for (const auto& cand : cands)
    if (cand.backbone == bb.name) batch = std::max(batch, cand.head.batch);
  const int64_t activations =
      tail.KeptValuesPerImage(whole->dims) * c.task.train.BatchShare(batch) * static_cast<int64_t>(sizeof(float));
  const int64_t limit = c.task.train.MapsLimit(activations);
  if (workflow::MapsKeepBytes(whole->bytes(), limit) == 0) return whole;
  whole.reset();
  std::unique_ptr<MapsSource> s = OpenMaps(c, bb, "train", limit);
  if (c.root() || alone)
    c.Say(
        fmt::format("fine-tuning {}: the training maps ({:.1f} MB) streamed from the NAM, at most {:.1f} MB a "
                    "rank ({} part{} of {:.1f} MB a window; the rank's memory {:.1f} MB less {:.1f} MB of "
                    "activations)",
                    bb.name, static_cast<double>(s->bytes()) / 1e6, static_cast<double>(limit) / 1e6, s->window_parts(),
                    s->window_parts() == 1 ? "" : "s", static_cast<double>(s->part_bytes()) / 1e6,
                    static_cast<double>(c.task.train.rank_memory) / 1e6, static_cast<double>(activations) / 1e6));
  return s;
}

void Finetune(StepContext& c, const std::vector<workflow::Candidate>& cands, const parallel::Straggler& straggler,
              const Stager& staged, const Reuser& reused) {
  parallel::Comm& world = *c.comm;
  const bool alone = !workflow::RanksShareModels(c.task.train.mode);
  std::map<std::string, std::unique_ptr<MapsSource>> maps;  // the training maps, by backbone
  BackboneTails tails(c);
  if (alone && world.size() > 1 && !cands.empty()) {
    std::string dealt;
    for (size_t i = static_cast<size_t>(world.rank()); i < cands.size(); i += static_cast<size_t>(world.size()))
      dealt += (dealt.empty() ? "" : ", ") + cands[i].id;
    c.Say("fine-tuning candidates dealt in turn: " + (dealt.empty() ? std::string("none") : dealt));
  }
  for (size_t i = 0; i < cands.size(); ++i) {
    if (alone && static_cast<int>(i % static_cast<size_t>(world.size())) != world.rank()) continue;
    const workflow::Candidate& cand = cands[i];
    std::optional<nam::ObjectInfo> before;
    int have = 0;
    if (alone || c.root()) {  // one rank decides for all that train it
      before = StagedBefore(c, cand);
      have = before ? 1 : 0;
    }
    if (!alone) world.Bcast(&have, sizeof have, 0);
    if (have) {
      if (before) reused(cand, *before);
      continue;
    }
    const workflow::BackboneSpec& bb = c.pipeline().Backbone(cand.backbone);
    std::unique_ptr<kernels::Tail> tail = tails.Make(bb);
    if (!maps.count(bb.name)) maps.emplace(bb.name, TrainingMaps(c, bb, *tail, cands, alone));
    MapsSource& m = *maps.at(bb.name);
    std::unique_ptr<kernels::Head> init;
    if (!cand.warm_start.empty()) {
      const nam::Object w = c.store->Get(cand.warm_start);
      try {
        init = std::make_unique<kernels::Head>(
            HeadFromModel(w, workflow::CandidateFromJson(w.info.meta.at("candidate")).head));
      } catch (const nlohmann::json::exception& e) {
        Throw(ErrorKind::kCorrupt, "NAM object '" + w.info.name + "': model metadata: " + e.what());
      }
      const TailWeights tw = TailOfModel(w);
      if (!tw.empty()) ApplyTail(tw, tail.get(), "NAM object '" + w.info.name + "'");
    }
    parallel::FinetuneData& data = m;
    const MapsSource::Stats read_before = m.stats();
    const std::vector<float> feats = parallel::TailFeatures(tail.get(), data, 64);
    kernels::Head h =
        kernels::InitHead(cand.head, feats.data(), m.labels.data(), m.n, tail->FeatureDim(), m.classes, init.get());
    parallel::SelfComm self;
    parallel::FinetuneOptions opt;
    opt.backbone_lr_scale = cand.backbone_lr_scale;
    if (!alone) opt.straggler = straggler;
    parallel::TrainStats st;
    switch (c.task.train.mode) {
      case TrainMode::kAsync:
      case TrainMode::kHybrid:
        st = parallel::FinetuneParameterServer(world, data, tail.get(), &h, opt, PsOptionsOf(c.task.train, straggler));
        break;
      case TrainMode::kSync:
        st = parallel::FinetuneSync(world, data, tail.get(), &h, opt);
        break;
      case TrainMode::kIndependent:
        st = parallel::FinetuneSync(self, data, tail.get(), &h, opt);
        st.mode = TrainMode::kIndependent;
        break;
      case TrainMode::kAuto:
        Throw(ErrorKind::kInternal, "train: mode auto in a task (the planner resolves it)");
    }
    if (m.streamed()) {
      const MapsSource::Stats ms = m.stats();
      c.Say(
          fmt::format("fine-tuning {}: rank {} read {} maps parts ({:.1f} MB), held at most {:.1f} MB, waited "
                      "{:.2f} s for them",
                      cand.id, world.rank(), ms.parts_read - read_before.parts_read,
                      static_cast<double>(ms.bytes_read - read_before.bytes_read) / 1e6,
                      static_cast<double>(ms.peak_bytes) / 1e6, ms.wait_seconds - read_before.wait_seconds));
    }
    if (!alone && world.rank() != 0) continue;
    Features shape;
    shape.n = m.n;
    shape.dim = h.in_dim;
    shape.classes = h.classes;
    staged(cand, shape, h, st, tail.get());
  }
}

}  // namespace

void Train(StepContext& c) {
  const workflow::TrainLayout& layout = c.task.train;
  parallel::Comm& world = *c.comm;
  const parallel::Straggler straggler =
      StragglerFor(workflow::Step::kTrain, parallel::Straggler{layout.straggler_rank, layout.straggler_factor});
  const TrainMode mode = layout.mode;
  if (workflow::UsesParameterServers(mode) && world.size() != layout.processes())
    Throw(ErrorKind::kInvalidInput,
          fmt::format("train: mode {} needs {} processes ({} ranks + {} server(s)), this step has {}; start it with "
                      "mpirun -n {} (or srun --ntasks={} --mpi=pmix)",
                      workflow::TrainModeName(mode), layout.processes(), layout.ranks, layout.servers, world.size(),
                      layout.processes(), layout.processes()));
  if (workflow::RanksInLockstep(mode) && world.size() != layout.ranks && c.root())
    c.Say(fmt::format("note: the task asks for {} sync ranks, this step has {}", layout.ranks, world.size()));
  std::map<std::string, Features> cache;
  std::vector<workflow::Candidate> cands, finetuned;  // heads on frozen features; fine-tuning
  for (const auto& cand : c.task.candidates) (cand.finetune ? finetuned : cands).push_back(cand);
  if (c.small_macs >= 0) {  // in the coordinator, if it is little work: forward, and backward at about twice that
    if (!finetuned.empty()) c.CheckSmall(std::numeric_limits<double>::infinity());  // a backbone's layers: never small
    double macs = 0;
    for (const auto& cand : cands) {
      const FeaturesIndex f = FeaturesShape(c, cand.backbone, "train");
      macs += 3 * static_cast<double>(f.n * cand.head.epochs) * HeadMacsPerRow(cand.head, f.dim, f.classes);
    }
    c.CheckSmall(macs);
  }
  const auto start = std::chrono::steady_clock::now();
  nlohmann::json trained = nlohmann::json::array();  // what this rank staged, for the step's summary
  const Stager staged = [&](const workflow::Candidate& cand, const Features& f, const kernels::Head& h,
                            const parallel::TrainStats& st, const kernels::Tail* tail) {
    Stage(c, cand, f, h, st, tail);
    trained.push_back({{"candidate", cand.id}, {"backbone", cand.backbone}, {"rows", f.n}, {"updates", st.updates},
                       {"seconds", st.seconds}, {"rank", world.rank()}, {"together", st.together}});
    if (tail) trained.back()["finetuned_weights"] = tail->ParamCount();
  };
  if (workflow::UsesParameterServers(mode)) {
    TrainWithServers(c, cands, straggler, cache, staged);
  } else {
    const std::vector<int> owner = !workflow::RanksShareModels(mode) && world.size() > 1 && !cands.empty()
                                       ? DealCandidates(c, cands)
                                       : std::vector<int>(cands.size(), world.rank());
    TrainInBatches(c, cands, owner, straggler, cache, staged);
  }
  const Reuser reused = [&](const workflow::Candidate& cand, const nam::ObjectInfo& info) {
    c.Say(fmt::format("{}: staged by an earlier attempt of this step, not trained again ({})", cand.id, info.name));
    // No work of this attempt's: the step's costs (orchestrator/placement.cc) count none for it.
    trained.push_back({{"candidate", cand.id},
                       {"backbone", cand.backbone},
                       {"rows", info.meta.value("train_rows", int64_t{0})},
                       {"updates", 0},
                       {"seconds", 0.0},
                       {"rank", world.rank()},
                       {"together", 1},
                       {"reused", true}});
  };
  Finetune(c, finetuned, straggler, staged, reused);
  // The step's figures (docs/formats.md): what each candidate cost, for results and planning.
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const nlohmann::json reading = c.OverlapReport();  // how this rank read its features (said in the log)
  auto parts = world.Gather(trained.dump(), 0);
  if (c.root()) {
    nlohmann::json all = nlohmann::json::array();
    for (const auto& p : parts)
      for (auto& e : nlohmann::json::parse(p)) all.push_back(std::move(e));
    nlohmann::json summary = {{"mode", mode},    {"ranks", layout.ranks}, {"processes", world.size()},
                              {"wall_s", wall}, {"candidates", all}, {"overlap", reading}};
    c.store->Put(workflow::TrainedObject(c.task.run, c.task.round), summary.dump(), {{"kind", "train-summary"}});
  }
  world.Barrier();  // every model staged before any rank reports success
}

}  // namespace msaflow::modules
