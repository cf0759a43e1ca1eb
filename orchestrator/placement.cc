#include "orchestrator/placement.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "common/error.h"

namespace msaflow::orchestrator {
namespace {

using nlohmann::json;

double Num(const json& j, const char* key) { return j.contains(key) && j[key].is_number() ? j[key].get<double>() : 0.0; }

int64_t Limit(const Machine& m, const workflow::StepSpec& s, unsigned cores, std::string* why) {
  const ModuleSpec& mod = m.Module(s.module, "steps");
  int64_t limit = mod.max_ranks;
  *why = fmt::format("max_ranks {} of module {}", mod.max_ranks, s.module);
  if (m.OnThisHost() && cores > 0 && static_cast<int64_t>(cores) < limit) {
    limit = cores;
    *why = fmt::format("the {} cores of this machine (module {} allows {})", cores, s.module, mod.max_ranks);
  }
  return std::max<int64_t>(1, limit);
}

// Train's ranks are the placement's only where the mode leaves them free.
bool TrainRanksFree(const workflow::StepSpec& s) {
  switch (s.parallel.mode) {
    case workflow::TrainMode::kAuto:
    case workflow::TrainMode::kIndependent:
    case workflow::TrainMode::kSync: return true;
    case workflow::TrainMode::kAsync:
    case workflow::TrainMode::kHybrid: return false;
  }
  return false;
}

// The most ranks `step` may have, and why; nullopt when the pipeline fixes them (the step is
// absent, or train in a mode whose layout it sets; then `pl` says so).
std::optional<int64_t> StepLimit(const workflow::Pipeline& p, const Machine& m, workflow::Step step, unsigned cores,
                                 std::string* why, Placement* pl) {
  const workflow::StepSpec* spec = p.FindStep(step);
  if (!spec) return std::nullopt;
  const workflow::StepSpec& s = *spec;
  const bool train = step == workflow::Step::kTrain;
  if (train && !TrainRanksFree(s)) {
    pl->ranks[step] = s.ranks;
    pl->why.push_back(fmt::format("{:<9} {} rank(s) as the pipeline says: mode {} fixes its layout", StepName(step),
                                  s.ranks, workflow::TrainModeName(s.parallel.mode)));
    return std::nullopt;
  }
  int64_t limit = Limit(m, s, cores, why);
  if (train && !workflow::RanksInLockstep(s.parallel.mode) && p.rounds.candidates < limit) {
    limit = std::max<int64_t>(1, p.rounds.candidates);
    *why = fmt::format("{} candidates per round, trained independently", p.rounds.candidates);
  }
  return limit;
}

}  // namespace

json ToJson(const StepCost& c) {
  return {{"ranks", c.ranks}, {"wall_s", c.wall_s}, {"work_s", c.work_s}, {"items", c.items},
          {"unit", c.unit},   {"per_item_s", c.PerItem()}, {"serial_s", c.serial_s}};
}

StepCost StepCostFromJson(const json& j, const std::string& where) {
  StepCost c;
  try {
    c.ranks = j.at("ranks");
    c.wall_s = j.at("wall_s");
    c.work_s = j.at("work_s");
    c.items = j.at("items");
    c.unit = j.at("unit");
    c.serial_s = j.at("serial_s");
  } catch (const json::exception& e) {
    Throw(ErrorKind::kInvalidInput, where + ": not a step cost (" + e.what() + ")");
  }
  return c;
}

double PassShare(const json& features_entry) {
  const json others = features_entry.value("one_pass_with", json::array());
  return 1.0 / static_cast<double>(1 + (others.is_array() ? others.size() : 0));
}

std::map<workflow::Step, StepCost> MeasureRound(const json& round, const workflow::Pipeline& p) {
  using workflow::Step;
  std::map<Step, StepCost> out;
  const json steps = round.value("step_seconds", json::object());
  for (const auto& [name, secs] : steps.items()) {
    const std::optional<Step> step = workflow::StepFromName(name);
    if (!step) continue;
    StepCost c;
    c.step = *step;
    c.unit = workflow::WorkUnit(*step);
    c.wall_s = secs.is_number() ? secs.get<double>() : 0;
    const workflow::StepSpec* spec = p.FindStep(*step);
    c.ranks = spec ? spec->ranks : 1;
    out[*step] = c;
  }
  if (out.count(Step::kPrepare) && round.contains("features")) {
    StepCost& c = out[Step::kPrepare];
    for (const auto& e : round["features"].value("computed", json::array())) {
      c.ranks = e.value("ranks", c.ranks);
      c.items += e.value("rows", int64_t{0});
      for (const auto& r : e.value("per_rank", json::array())) c.work_s += Num(r, "seconds") * PassShare(e);
    }
    // Fine-tuning's maps (the trunk to the freeze point over every image) divide over the ranks
    // too: each rank computes its run of parts; the entry's seconds are the wall time of them all.
    // Maps computed in their features' pass are in that pass's seconds and rows already.
    for (const auto& e : round["features"].value("maps", json::array())) {
      if (!e.value("computed", false) || e.value("with_features", false)) continue;
      c.items += e.value("rows", int64_t{0});
      c.work_s += Num(e, "seconds") * static_cast<double>(e.value("ranks", int64_t{1}));
    }
  }
  if (out.count(Step::kTrain) && round.contains("training")) {
    StepCost& c = out[Step::kTrain];
    const json& t = round["training"];
    const std::optional<workflow::TrainMode> mode = workflow::TrainModeFromName(t.value("mode", ""));
    c.ranks = t.value("processes", c.ranks);
    // Independent candidates run on one rank each; the other modes keep every process busy.
    // Heads trained together (one pass serves K heads) each report the group's seconds: the
    // group's time counts once (it was counted K times, and `plan --ranks auto` predicted a
    // train step several times too long).
    const double per = mode && !workflow::RanksShareModels(*mode) ? 1.0 : static_cast<double>(c.ranks);
    for (const auto& e : t.value("candidates", json::array())) {
      const double together = static_cast<double>(std::max<int64_t>(1, e.value("together", int64_t{1})));
      c.work_s += Num(e, "seconds") * per / together;
      c.items += e.value("updates", int64_t{0});
    }
  }
  if (out.count(Step::kEvaluate) && round.contains("evaluation")) {
    StepCost& c = out[Step::kEvaluate];
    const json& e = round["evaluation"];
    c.ranks = e.value("ranks", c.ranks);
    c.items = e.value("tasks", int64_t{0});
    for (const auto& r : e.value("per_rank", json::array()))
      if (r.value("works", true)) c.work_s += Num(r, "busy_s");
  }
  for (auto& [step, c] : out) c.serial_s = std::max(0.0, c.wall_s - c.work_s / static_cast<double>(std::max<int64_t>(1, c.ranks)));
  return out;
}

Placement PlaceFromModel(const workflow::Pipeline& p, const Machine& m, const json& favoured, const std::string& source,
                         unsigned cores) {
  Placement pl;
  pl.source = source;
  for (const workflow::Step step : workflow::DivisibleSteps()) {
    const char* name = workflow::StepName(step);
    std::string limit_why;
    const std::optional<int64_t> cap = StepLimit(p, m, step, cores, &limit_why, &pl);
    if (!cap) continue;
    if (!favoured.is_object() || !favoured.contains(name)) {
      pl.ranks[step] = 1;
      pl.why.push_back(fmt::format("{:<9} 1 rank: the runs measured no work to share (features reused?)", name));
      continue;
    }
    const json& f = favoured.at(name);
    // The model's seconds at each rank count it tried, taken in order while the next saves >= 5 %.
    std::vector<std::pair<int64_t, double>> tries;
    for (const auto& [r, t] : f.at("seconds_by_ranks").items()) tries.emplace_back(std::stoll(r), t.get<double>());
    std::sort(tries.begin(), tries.end());
    int64_t best = 1, next = 0;
    double best_s = tries.empty() ? 0 : tries.front().second;
    const double one = best_s;
    bool capped = false;  // the model would have taken more than the cap allows
    for (const auto& [r, t] : tries) {
      if (r == 1) continue;
      if (t >= best_s * 0.95) {
        next = r;
        break;
      }
      if (r > *cap) {
        capped = true;
        break;
      }
      best = r, best_s = t;
    }
    pl.ranks[step] = best;
    const std::string reason = capped ? "capped by " + limit_why
                               : next ? fmt::format("{} ranks would save under 5 % in the model", next)
                                      : "at the limit: " + limit_why;
    pl.why.push_back(fmt::format(
        "{:<9} {} rank{}: {:.2f} core-s of work in round {}, {:.2f} s that does not divide; predicted {:.2f} s "
        "({:.2f} s on one rank); {}",
        name, best, best > 1 ? "s" : "", f.value("work_s", 0.0), f.value("round", 0), f.value("serial_s", 0.0), best_s,
        one, reason));
  }
  return pl;
}

Placement PlaceWithoutCosts(const workflow::Pipeline& p, const Machine& m, unsigned cores) {
  Placement pl;
  pl.source = "no earlier run";
  for (const workflow::Step step : workflow::DivisibleSteps()) {
    std::string why;
    const std::optional<int64_t> cap = StepLimit(p, m, step, cores, &why, &pl);
    if (!cap) continue;
    const int64_t r = *cap;
    pl.ranks[step] = r;
    pl.why.push_back(fmt::format("{:<9} {} rank{}: no measured costs yet, so {}", workflow::StepName(step), r,
                                 r > 1 ? "s" : "", why));
  }
  return pl;
}

workflow::Pipeline ApplyPlacement(workflow::Pipeline p, const Placement& pl) {
  for (const auto& [step, r] : pl.ranks) {
    if (workflow::StepSpec* spec = p.FindStep(step)) spec->ranks = r;
  }
  return p;
}

}  // namespace msaflow::orchestrator
