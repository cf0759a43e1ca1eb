#include "orchestrator/rounds.h"

#include <fmt/core.h>

#include <algorithm>
#include <set>

#include "common/error.h"
#include "orchestrator/placement.h"

namespace msaflow::orchestrator {

using nlohmann::json;

RoundOutcome ReadRoundOutcome(nam::Store& store, const std::string& run, int round) {
  RoundOutcome o;
  o.best = json::parse(store.Get(BestObject(run, round)).bytes);
  o.prepared = json::parse(store.Get(PreparedObject(run, round)).bytes);
  o.evaluation = json::parse(store.Get(workflow::EvaluatedObject(run, round)).bytes);
  for (auto& r : o.evaluation["per_rank"]) r.erase("task_ids");  // they stay in the NAM object
  o.training = json::parse(store.Get(workflow::TrainedObject(run, round)).bytes);
  return o;
}

json RoundEntry(const Pipeline& p, int round, const RoundOutcome& o, json step_seconds) {
  const json& best = o.best;
  json entry = {{"round", round}, {"champion", best.at("champion")}, {"top_k", best.at("top_k")},
                {"candidates", best.at("all")}, {"features", o.prepared},
                {"features_computed", o.prepared.at("computed").size()},
                {"features_reused", o.prepared.at("reused").size()}, {"training", o.training},
                {"evaluation", o.evaluation}, {"step_seconds", std::move(step_seconds)},
                {"selection", {{"device", best.value("device", "")}, {"fpga", best.value("fpga", json::object())}}}};
  // What each step cost per item, for `msaflow plan --ranks auto` (orchestrator/placement.h).
  json costs = json::object();
  for (const auto& [step, c] : MeasureRound(entry, p)) costs[workflow::StepName(step)] = ToJson(c);
  entry["costs"] = costs;
  return entry;
}

std::vector<Candidate> RoundLoop::Candidates(int round) const {
  if (round == 1) return FirstRound(p_);
  std::vector<Ranked> backbone_best;
  for (const auto& [bb, r] : bb_best_) backbone_best.push_back(r);
  return NextRound(p_, round, ranking_, backbone_best);
}

bool RoundLoop::Absorb(int round, const RoundOutcome& o, json round_entry) {
  const json& best = o.best;
  ranking_.clear();
  kept_.clear();
  ranked_.clear();
  for (const auto& e : best.at("all")) {
    ranked_.push_back({{CandidateFromJson(e.at("candidate")), e.at("model"), e.value("result", "")}, e.at("accuracy")});
    json classes = json::object();
    for (const char* k : {"per_class", "class_names"})
      if (e.contains(k)) classes[k] = e[k];
    ranking_.push_back({CandidateFromJson(e.at("candidate")), e.at("accuracy"), e.at("model"), e.value("test", json()),
                        std::move(classes)});
    const std::string bb = e.at("candidate").at("backbone");
    if (!per_bb_.contains(bb) || per_bb_[bb].get<double>() < e.at("accuracy").get<double>()) {
      per_bb_[bb] = e.at("accuracy");
      bb_best_[bb] = ranking_.back();
      per_bb_test_[bb] = {{"candidate", e.at("candidate").at("id")}, {p_.select_on + "_accuracy", e.at("accuracy")}};
    }
    // Its test figure, also when it comes later (a halving round before the last held the test
    // split back, and the last one scored the model as one it kept).
    if (e.contains("test") && per_bb_test_[bb].value("candidate", "") == e.at("candidate").at("id"))
      per_bb_test_[bb]["test_accuracy"] = e["test"].value("accuracy", 0.0);
  }
  for (const auto& e : best.at("top_k")) kept_.push_back({CandidateFromJson(e.at("candidate")), e.at("model"), e.at("result")});
  rounds_.push_back(std::move(round_entry));
  const double acc = best.at("champion").at("accuracy");
  if (best_so_far_ >= 0 && acc - best_so_far_ < p_.rounds.min_delta) {
    ++stale_;
  } else {
    stale_ = 0;
  }
  best_so_far_ = std::max(best_so_far_, acc);
  if (round < p_.rounds.max && stale_ >= p_.rounds.patience) {
    stop_reason_ = fmt::format("no gain >= {} for {} round(s)", p_.rounds.min_delta, stale_);
    return true;
  }
  return false;
}

std::vector<std::pair<KeptCandidate, double>> RoundLoop::HalvingKept(const std::vector<Candidate>& fresh) const {
  std::set<std::string> race;
  for (const auto& c : fresh) race.insert(c.backbone);
  std::vector<std::pair<KeptCandidate, double>> out;
  for (const auto& r : ranked_)
    if (out.size() < static_cast<size_t>(p_.rounds.top_k) && race.count(r.first.candidate.backbone)) out.push_back(r);
  return out;
}

std::vector<KeptCandidate> RoundLoop::KeptFor(const std::vector<Candidate>& fresh) const {
  if (p_.rounds.strategy != workflow::Strategy::kHalving) return kept_;
  std::vector<KeptCandidate> out;
  for (auto& [k, metric] : HalvingKept(fresh)) out.push_back(std::move(k));
  return out;
}

bool RoundLoop::TestsInRound(int round, const std::vector<Candidate>& fresh) const {
  if (p_.rounds.strategy != workflow::Strategy::kHalving || p_.select_on == "test" || round >= p_.rounds.max)
    return true;
  // A race of one model (its cuts, raw pixels beside it) spares no pass by waiting, as its data
  // does not grow either (HalvingDataFraction): its test split comes in this round's prepare.
  if (workflow::ModelsOf(p_, fresh) < 2) return true;
  if (rounds_.empty()) return false;                  // the stop rule looks back: round 1 ends a run only as its last
  if (stale_ + 1 < p_.rounds.patience) return false;  // even a round without gain leaves the run going
  // With min_delta 0 only a round worse than the best so far counts against patience, and it
  // cannot be worse when its select ranks a model as good again (the best kept comes first).
  if (p_.rounds.min_delta > 0) return true;
  const auto kept = HalvingKept(fresh);
  return kept.empty() || kept.front().second < best_so_far_;
}

const Ranked& RoundLoop::champion() const {
  if (ranking_.empty()) Throw(ErrorKind::kInternal, "RoundLoop: no round has ended");
  return ranking_.front();
}

bool RoundLoop::held_out() const { return p_.select_on != "test" && champion().test.is_object(); }

json RoundLoop::Results(const std::string& run, const std::string& nam_uri, double seconds) const {
  const Ranked& champ = champion();
  json results = {{"format", kResultsFormat}, {"run", run}, {"pipeline", p_.name}, {"nam", nam_uri}, {"rounds", rounds_}};
  results["champion"] = {{"candidate", ToJson(champ.candidate)}, {"accuracy", champ.metric}, {"model", champ.model},
                         {"selected_on", p_.select_on}};
  // Per class (by index, with the image folder's names where there are), on the selection split.
  if (champ.classes.contains("per_class")) results["champion"]["per_class"] = champ.classes["per_class"];
  if (champ.classes.contains("class_names")) results["class_names"] = champ.classes["class_names"];
  // The run's result: the champion on the test split, which chose nothing (unless the pipeline
  // selects on test, and then the figure is optimistic and says so).
  const bool test_held_out = held_out();
  results["champion"]["test"] = test_held_out ? champ.test : json{{"accuracy", champ.metric}};
  results["result"] = {{"split", "test"},
                       {"accuracy", test_held_out ? champ.test.value("accuracy", 0.0) : champ.metric},
                       {"selected_on", p_.select_on},
                       {"optimistic", !test_held_out}};
  results["best_per_backbone"] = per_bb_;
  results["best_per_backbone_on_test"] = per_bb_test_;
  results["stop_reason"] = stop_reason_;
  results["seconds"] = seconds;
  return results;
}

}  // namespace msaflow::orchestrator
