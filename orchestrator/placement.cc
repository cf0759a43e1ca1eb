#include "orchestrator/placement.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "common/error.h"

namespace msaflow::orchestrator {
namespace {

using nlohmann::json;

std::string Plural(const std::string& unit, int64_t n) {
  if (n == 1) return unit;
  return unit + (unit.back() == 's' ? "es" : "s");
}

double Num(const json& j, const char* key) { return j.contains(key) && j[key].is_number() ? j[key].get<double>() : 0.0; }

// The steps whose work divides among ranks, and the unit of that work.
const std::vector<std::pair<std::string, std::string>>& Divisible() {
  static const std::vector<std::pair<std::string, std::string>> steps = {
      {"prepare", "image pass"}, {"train", "training step"}, {"evaluate", "(model x shard) task"}};
  return steps;
}

// What starting one module process costs: the shortest one-rank step of the round (load,
// store, select do little besides starting, reading the task and reaching the NAM).
double LaunchCost(const std::map<std::string, StepCost>& costs) {
  double best = 0;
  for (const char* s : {"load", "store", "select"}) {
    auto it = costs.find(s);
    if (it != costs.end() && it->second.wall_s > 0 && (best == 0 || it->second.wall_s < best)) best = it->second.wall_s;
  }
  return best > 0 ? best : 0.5;
}

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
std::optional<int64_t> StepLimit(const workflow::Pipeline& p, const Machine& m, const std::string& step,
                                 unsigned cores, std::string* why, Placement* pl) {
  const workflow::StepSpec* spec = p.FindStep(step);
  if (!spec) return std::nullopt;
  const workflow::StepSpec& s = *spec;
  if (step == "train" && !TrainRanksFree(s)) {
    pl->ranks[step] = s.ranks;
    pl->why.push_back(fmt::format("{:<9} {} rank(s) as the pipeline says: mode {} fixes its layout", step, s.ranks,
                                  workflow::TrainModeName(s.parallel.mode)));
    return std::nullopt;
  }
  int64_t limit = Limit(m, s, cores, why);
  if (step == "train" && s.parallel.mode != workflow::TrainMode::kSync && p.rounds.candidates < limit) {
    limit = std::max<int64_t>(1, p.rounds.candidates);
    *why = fmt::format("{} candidates per round, trained independently", p.rounds.candidates);
  }
  return limit;
}

// A round's costs as the run recorded them ("costs"), or measured from its step summaries
// when the results predate that field.
std::map<std::string, StepCost> RoundCosts(const json& round, const workflow::Pipeline& p, const std::string& where) {
  if (!round.contains("costs")) return MeasureRound(round, p);
  std::map<std::string, StepCost> out;
  for (const auto& item : round["costs"].items()) {
    StepCost c = StepCostFromJson(item.value(), where + ": costs/" + item.key());
    c.step = item.key();
    out[item.key()] = c;
  }
  return out;
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

std::map<std::string, StepCost> MeasureRound(const json& round, const workflow::Pipeline& p) {
  std::map<std::string, StepCost> out;
  const json steps = round.value("step_seconds", json::object());
  for (const auto& [step, secs] : steps.items()) {
    StepCost c;
    c.step = step;
    c.wall_s = secs.is_number() ? secs.get<double>() : 0;
    const workflow::StepSpec* spec = p.FindStep(step);
    c.ranks = spec ? spec->ranks : 1;
    out[step] = c;
  }
  if (out.count("prepare") && round.contains("features")) {
    StepCost& c = out["prepare"];
    c.unit = "image pass";
    for (const auto& e : round["features"].value("computed", json::array())) {
      c.ranks = e.value("ranks", c.ranks);
      c.items += e.value("rows", int64_t{0});
      for (const auto& r : e.value("per_rank", json::array())) c.work_s += Num(r, "seconds");
    }
  }
  if (out.count("train") && round.contains("training")) {
    StepCost& c = out["train"];
    const json& t = round["training"];
    c.unit = "training step";
    const std::string mode = t.value("mode", "");
    c.ranks = t.value("processes", c.ranks);
    // Independent candidates run on one rank each; the other modes keep every process busy.
    // Heads trained together (one pass serves K heads) each report the group's seconds: the
    // group's time counts once (it was counted K times, and `plan --ranks auto` predicted a
    // train step several times too long).
    const double per = mode == "independent" ? 1.0 : static_cast<double>(c.ranks);
    for (const auto& e : t.value("candidates", json::array())) {
      const double together = static_cast<double>(std::max<int64_t>(1, e.value("together", int64_t{1})));
      c.work_s += Num(e, "seconds") * per / together;
      c.items += e.value("updates", int64_t{0});
    }
  }
  if (out.count("evaluate") && round.contains("evaluation")) {
    StepCost& c = out["evaluate"];
    const json& e = round["evaluation"];
    c.unit = "(model x shard) task";
    c.ranks = e.value("ranks", c.ranks);
    c.items = e.value("tasks", int64_t{0});
    for (const auto& r : e.value("per_rank", json::array()))
      if (r.value("works", true)) c.work_s += Num(r, "busy_s");
  }
  for (auto& [step, c] : out) c.serial_s = std::max(0.0, c.wall_s - c.work_s / static_cast<double>(std::max<int64_t>(1, c.ranks)));
  return out;
}

Placement PlaceFromCosts(const workflow::Pipeline& p, const Machine& m, const json& results,
                         const std::string& results_path, unsigned cores) {
  Placement pl;
  // Per step, the round in which it worked most (round 1 computes the features; later
  // rounds reuse them), and the launch cost measured in that round.
  std::map<std::string, StepCost> most;
  std::map<std::string, double> launch;
  std::map<std::string, int> at_round;
  try {
    pl.source = fmt::format("run {} ({})", results.value("run", "?"), results_path);
    for (const auto& r : results.value("rounds", json::array())) {
      const int round = r.value("round", 0);
      auto costs = RoundCosts(r, p, fmt::format("{}: round {}", results_path, round));
      for (const auto& [step, unit] : Divisible()) {
        auto it = costs.find(step);
        if (it == costs.end()) continue;
        if (!most.count(step) || it->second.work_s > most[step].work_s) {
          most[step] = it->second;
          launch[step] = LaunchCost(costs);
          at_round[step] = round;
        }
      }
    }
  } catch (const json::exception& e) {
    Throw(ErrorKind::kCorrupt, results_path + ": not the results of a run (" + e.what() + ")");
  }
  for (const auto& [step, unit] : Divisible()) {
    std::string limit_why;
    const std::optional<int64_t> cap = StepLimit(p, m, step, cores, &limit_why, &pl);
    if (!cap) continue;
    const int64_t limit = *cap;
    if (!most.count(step) || most[step].work_s <= 0) {
      pl.ranks[step] = 1;
      pl.why.push_back(fmt::format("{:<9} 1 rank: {} measured no work to share (features reused?)", step,
                                   pl.source));
      continue;
    }
    const StepCost& c = most[step];
    const double l = launch[step];
    const auto by_work = static_cast<int64_t>(std::floor(c.work_s / l));
    const int64_t r = std::clamp<int64_t>(by_work, 1, limit);
    pl.ranks[step] = r;
    const double predicted = c.serial_s + c.work_s / static_cast<double>(r);
    std::string reason =
        by_work < 1 ? fmt::format("its work is less than one process start ({:.2f} s)", l)
        : by_work <= limit ? fmt::format("each rank gets >= {:.2f} s of work, the cost of starting a process", l)
                           : "capped by " + limit_why;
    pl.why.push_back(fmt::format(
        "{:<9} {} rank{}: {:.2f} rank-s of work in round {} ({} {} at {:.3g} ms), {:.2f} s that does not divide; "
        "predicted {:.1f} s; {}",
        step, r, r > 1 ? "s" : "", c.work_s, at_round[step], c.items, Plural(c.unit, c.items), 1e3 * c.PerItem(),
        c.serial_s, predicted, reason));
  }
  return pl;
}

Placement PlaceWithoutCosts(const workflow::Pipeline& p, const Machine& m, unsigned cores) {
  Placement pl;
  pl.source = "no earlier run";
  for (const auto& [step, unit] : Divisible()) {
    std::string why;
    const std::optional<int64_t> cap = StepLimit(p, m, step, cores, &why, &pl);
    if (!cap) continue;
    const int64_t r = *cap;
    pl.ranks[step] = r;
    pl.why.push_back(fmt::format("{:<9} {} rank{}: no measured costs yet, so {}", step, r, r > 1 ? "s" : "", why));
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
