#include "workflow/candidates.h"

#include <fmt/core.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <set>
#include <string>
#include <type_traits>

namespace msaflow::workflow {
namespace {

std::string Id(int round, size_t i) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "r%d-c%02zu", round, i);
  return buf;
}

uint64_t SeedFor(const Pipeline& p, int round, size_t i) {
  std::seed_seq seq{static_cast<uint64_t>(p.rounds.seed), static_cast<uint64_t>(round), static_cast<uint64_t>(i)};
  std::mt19937_64 g(seq);
  return g() % 1000000007ULL;
}

// The order of the rows for every candidate of a round: the same for all, so that the heads
// on one backbone see the same batches and train together (parallel/train.h).
uint64_t DataSeedFor(const Pipeline& p, int round) { return SeedFor(p, round, 777767); }

std::string Sci(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0e", v);
  return buf;
}

// Every configuration of the search space, per backbone.
std::vector<std::vector<Candidate>> Grid(const Pipeline& p) {
  std::vector<std::vector<Candidate>> per_bb;
  for (const auto& bb : p.backbones) {
    std::vector<Candidate> g;
    for (const auto& type : p.head.types)
      for (int64_t hidden : type == "mlp" ? p.head.hidden : std::vector<int64_t>{0})
        for (const auto& opt : p.head.optimizers)
          // L-BFGS has no learning rate: one configuration per l2 and cap, not one per lr too.
          for (double lr : opt == "lbfgs" ? std::vector<double>{p.head.lr.front()} : p.head.lr)
            for (double l2 : p.head.l2)
              for (int64_t ep : p.head.epochs) {
                Candidate c;
                c.backbone = bb.name;
                c.head = {type, hidden, opt, lr, l2, ep, p.head.batch, 0};
                g.push_back(c);
              }
    per_bb.push_back(std::move(g));
  }
  return per_bb;
}

// Which of round r's candidates fine-tune (Pipeline::FinetunesIn), at what backbone learning
// rate (a fine-tuned parent's, else the head space's values in turn) and for how many epochs
// (finetune_epochs' values in turn, where the pipeline gives them).
void MarkFinetuning(const Pipeline& p, int round, std::vector<Candidate>& out) {
  const auto& scales = p.head.backbone_lr_scale;
  const auto& epochs = p.head.finetune_epochs;
  for (size_t i = 0; i < out.size(); ++i) {
    Candidate& c = out[i];
    if (!p.FinetunesIn(p.Backbone(c.backbone), round)) {
      c.finetune = false;
      continue;
    }
    if (!c.finetune || c.backbone_lr_scale <= 0) c.backbone_lr_scale = scales[i % scales.size()];
    if (!epochs.empty()) c.head.epochs = epochs[i % epochs.size()];
    c.finetune = true;
  }
}

std::vector<Candidate> Sample(const Pipeline& p, int round) {
  auto grid = Grid(p);
  std::mt19937_64 rng(SeedFor(p, round, 999983));
  for (auto& g : grid) std::shuffle(g.begin(), g.end(), rng);
  std::vector<Candidate> out;
  size_t want = static_cast<size_t>(p.rounds.candidates);
  for (size_t k = 0; out.size() < want; ++k) {
    bool any = false;
    for (auto& g : grid) {
      if (out.size() == want) break;
      // Past the grid's size, configurations repeat with other seeds.
      out.push_back(g[k % g.size()]);
      any = true;
    }
    if (!any) break;
  }
  for (size_t i = 0; i < out.size(); ++i) {
    out[i].id = Id(round, i);
    out[i].head.seed = SeedFor(p, round, i);
    out[i].head.data_seed = DataSeedFor(p, round);
  }
  MarkFinetuning(p, round, out);
  return out;
}

}  // namespace

nlohmann::json ToJson(const Candidate& c) {
  nlohmann::json j = {{"id", c.id},
                      {"backbone", c.backbone},
                      {"head",
                       {{"type", c.head.type},
                        {"hidden", c.head.hidden},
                        {"optimizer", c.head.optimizer},
                        {"lr", c.head.lr},
                        {"l2", c.head.l2},
                        {"epochs", c.head.epochs},
                        {"batch", c.head.batch},
                        {"seed", c.head.seed},
                        {"data_seed", c.head.data_seed}}},
                      {"warm_start", c.warm_start},
                      {"parent", c.parent}};
  if (c.finetune) j["finetune"] = {{"backbone_lr_scale", c.backbone_lr_scale}};
  return j;
}

namespace {

// An integer of a candidate as an integer: nlohmann::json converts a float (1e24) to one by a
// cast, undefined where it does not fit (the task fuzzer found it), so anything else is refused
// as json's own type errors are.
template <typename T>
T Integer(const nlohmann::json& v, const char* key) {
  if (!v.is_number_integer())
    throw nlohmann::json::type_error::create(302, std::string(key) + ": expected an integer, got " + v.dump(), nullptr);
  if (std::is_unsigned_v<T> && v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() < 0)
    throw nlohmann::json::out_of_range::create(406, std::string(key) + ": expected 0 or more, got " + v.dump(),
                                               nullptr);
  if (!std::is_unsigned_v<T> && v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{INT64_MAX})
    throw nlohmann::json::out_of_range::create(406, std::string(key) + ": too large, got " + v.dump(), nullptr);
  return v.get<T>();
}

}  // namespace

Candidate CandidateFromJson(const nlohmann::json& j) {
  Candidate c;
  c.id = j.at("id");
  c.backbone = j.at("backbone");
  const auto& h = j.at("head");
  c.head = {h.at("type"),
            Integer<int64_t>(h.at("hidden"), "head/hidden"),
            h.at("optimizer"),
            h.at("lr"),
            h.at("l2"),
            Integer<int64_t>(h.at("epochs"), "head/epochs"),
            Integer<int64_t>(h.at("batch"), "head/batch"),
            Integer<uint64_t>(h.at("seed"), "head/seed"),
            h.contains("data_seed") ? Integer<uint64_t>(h.at("data_seed"), "head/data_seed") : uint64_t{0}};
  c.warm_start = j.value("warm_start", "");
  c.parent = j.value("parent", "");
  if (j.contains("finetune")) {
    c.finetune = true;
    c.backbone_lr_scale = j["finetune"].at("backbone_lr_scale");
  }
  return c;
}

std::string HeadLabel(const kernels::HeadConfig& h) {
  std::string t = h.type == "mlp" ? "mlp-" + std::to_string(h.hidden) : h.type;
  if (h.optimizer == "lbfgs")  // no learning rate; epochs cap the iterations
    return t + " lbfgs l2=" + Sci(h.l2) + " it<=" + std::to_string(h.epochs);
  return t + " " + h.optimizer + " lr=" + Sci(h.lr) + " l2=" + Sci(h.l2) + " e=" + std::to_string(h.epochs);
}

int64_t HalvingEpochs(const Pipeline& p, int round) {
  const int64_t full = *std::max_element(p.head.epochs.begin(), p.head.epochs.end());
  double e = static_cast<double>(full);
  for (int64_t r = round; r < p.rounds.max; ++r) e /= static_cast<double>(p.rounds.eta);
  return std::max<int64_t>(round, std::llround(e));  // every round adds at least one epoch
}

double HalvingDataFraction(const Pipeline& p, int round, size_t models) {
  if (p.rounds.strategy != Strategy::kHalving || !p.rounds.grow_data || round >= p.rounds.max || models < 2) return 1;
  for (const auto& bb : p.backbones)
    if (bb.precision == kernels::Precision::kInt8) return 1;
  double g = 1;
  for (int64_t r = round; r < p.rounds.max; ++r) g /= static_cast<double>(p.rounds.eta);
  return std::min(1.0, std::max(g, p.rounds.rank_fraction));
}

std::string DataShareText(double fraction) {
  return fraction >= 1 ? std::string("all") : fmt::format("{:.3g} %", 100 * fraction);
}

int64_t HalvingRoundEpochs(const Pipeline& p, int round, size_t models) {
  const int64_t more = HalvingEpochs(p, round) - (round > 1 ? HalvingEpochs(p, round - 1) : 0);
  return std::max<int64_t>(1, std::llround(static_cast<double>(more) / HalvingDataFraction(p, round, models)));
}

namespace {

// The distinct ONNX files of the backbones `in` accepts.
template <typename In>
size_t ModelsAmong(const Pipeline& p, In in) {
  std::set<std::string> models;
  for (const auto& bb : p.backbones)
    if (bb.kind != BackboneKind::kPixels && in(bb.name)) models.insert(bb.onnx);
  return models.size();
}

}  // namespace

size_t ModelsOf(const Pipeline& p, const std::vector<Candidate>& cands) {
  std::set<std::string> names;
  for (const auto& c : cands) names.insert(c.backbone);
  return ModelsAmong(p, [&](const std::string& name) { return names.count(name) > 0; });
}

size_t ModelsOf(const Pipeline& p) {
  return ModelsAmong(p, [](const std::string&) { return true; });
}

Pipeline RoundPipeline(const Pipeline& p, int round, const std::vector<Candidate>& fresh) {
  if (p.rounds.strategy != Strategy::kHalving || fresh.empty()) return p;
  std::set<std::string> race;
  for (const auto& c : fresh) race.insert(c.backbone);
  const double g = HalvingDataFraction(p, round, ModelsOf(p, fresh));
  if (race.size() == p.backbones.size() && g >= 1) return p;
  nlohmann::json source = race.size() == p.backbones.size() ? p.source : KeepBackbones(p, race).source;
  if (g < 1) source["datasets"]["train"]["subset"] = {{"fraction", g}, {"seed", p.rounds.seed}};
  return PipelineFromSource(source);
}

std::vector<Candidate> FirstRound(const Pipeline& p) {
  std::vector<Candidate> out = Sample(p, 1);
  if (p.rounds.strategy == Strategy::kHalving)
    for (auto& c : out) c.head.epochs = HalvingRoundEpochs(p, 1, ModelsOf(p, out));
  return out;
}

namespace {

// halving's round r: the previous round's candidates, best first, the top ceil(n / eta)
// continued.
std::vector<Candidate> Continue(const Pipeline& p, int round, const std::vector<Ranked>& ranking) {
  const std::string prefix = "r" + std::to_string(round - 1) + "-";
  std::vector<const Ranked*> last;
  for (const Ranked& r : ranking)
    if (r.candidate.id.rfind(prefix, 0) == 0) last.push_back(&r);
  const size_t eta = static_cast<size_t>(p.rounds.eta);
  const size_t keep = std::max<size_t>(1, (last.size() + eta - 1) / eta);
  std::vector<Candidate> out;
  for (size_t i = 0; i < keep && i < last.size(); ++i) {
    Candidate c = last[i]->candidate;
    c.parent = c.id;
    c.warm_start = last[i]->model;
    c.id = Id(round, i);
    c.head.data_seed = DataSeedFor(p, round);
    out.push_back(c);
  }
  const size_t models = ModelsOf(p, out);  // the data, and so the epochs, depend on the models still in the race
  for (auto& c : out) c.head.epochs = HalvingRoundEpochs(p, round, models);
  // From finetune_from_round on, a continued candidate fine-tunes its backbone's tail, from its
  // parent's head (and tail, if the parent fine-tuned): the warm start above.
  MarkFinetuning(p, round, out);
  return out;
}

}  // namespace

std::vector<Candidate> NextRound(const Pipeline& p, int round, const std::vector<Ranked>& ranking,
                                 const std::vector<Ranked>& backbone_best) {
  if (ranking.empty()) return Sample(p, round);
  switch (p.rounds.strategy) {
    case Strategy::kRandom:
      return Sample(p, round);
    case Strategy::kHalving:
      return Continue(p, round, ranking);
    case Strategy::kPerturb:
    case Strategy::kRestart:
      break;  // children of the best kept candidates, below
  }
  size_t k = std::min<size_t>(static_cast<size_t>(p.rounds.top_k), ranking.size());
  std::vector<const Ranked*> parents;
  std::set<std::string> represented;
  for (size_t i = 0; i < k; ++i) {
    parents.push_back(&ranking[i]);
    represented.insert(ranking[i].candidate.backbone);
  }
  // Backbones close behind the champion keep a parent: best first, ties by candidate id.
  std::vector<const Ranked*> close;
  for (const Ranked& b : backbone_best)
    if (!represented.count(b.candidate.backbone) && b.metric >= ranking[0].metric - p.rounds.backbone_margin)
      close.push_back(&b);
  std::sort(close.begin(), close.end(), [](const Ranked* a, const Ranked* b) {
    return a->metric != b->metric ? a->metric > b->metric : a->candidate.id < b->candidate.id;
  });
  for (const Ranked* b : close)
    if (represented.insert(b->candidate.backbone).second) parents.push_back(b);
  std::mt19937_64 rng(SeedFor(p, round, 424242));
  std::vector<Candidate> out;
  for (size_t i = 0; i < static_cast<size_t>(p.rounds.candidates); ++i) {
    // Parents beyond the top-k come before the top-k's second children: every backbone kept
    // gets a candidate whenever the round has room for one per parent.
    const Ranked& parent = *parents[i % parents.size()];
    Candidate c = parent.candidate;
    c.parent = parent.candidate.id;
    c.warm_start.clear();
    c.id = Id(round, i);
    c.head.seed = SeedFor(p, round, i);
    c.head.data_seed = DataSeedFor(p, round);
    if (p.rounds.strategy == Strategy::kPerturb) {
      if (i == 0) {
        // Warm start: continue from the champion's weights with a smaller step.
        c.warm_start = parent.model;
        if (c.head.optimizer != "lbfgs") c.head.lr *= 0.5;
      } else {
        const double lr_factor = std::uniform_int_distribution<int>(0, 1)(rng) ? 2.0 : 0.5;
        if (c.head.optimizer != "lbfgs") c.head.lr *= lr_factor;  // L-BFGS has no learning rate
        c.head.l2 = std::clamp(c.head.l2 * (std::uniform_int_distribution<int>(0, 1)(rng) ? 3.0 : 0.3), 1e-7, 1.0);
      }
    }
    // The first round that fine-tunes after frozen ones: from the parent's head (the recipe's
    // second phase starts from the first's weights).
    if (p.FinetunesIn(p.Backbone(c.backbone), round) && !parent.candidate.finetune) c.warm_start = parent.model;
    out.push_back(c);
  }
  MarkFinetuning(p, round, out);
  return out;
}

}  // namespace msaflow::workflow
