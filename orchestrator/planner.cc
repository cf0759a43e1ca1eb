#include "orchestrator/planner.h"

#include "common/error.h"

namespace msaflow::orchestrator {

std::string ModelObject(const std::string& run, int round, const std::string& cand) {
  return "model/" + run + "/" + std::to_string(round) + "/" + cand;
}
std::string ResultObject(const std::string& run, int round, const std::string& cand) {
  return "result/" + run + "/" + std::to_string(round) + "/" + cand;
}
std::string BestObject(const std::string& run, int round) { return "best/" + run + "/" + std::to_string(round); }
std::string PreparedObject(const std::string& run, int round) {
  return "prepared/" + run + "/" + std::to_string(round);
}

RoundPlan PlanRound(const Pipeline& p, const Machine& m, const std::string& run_id, const std::string& nam_uri,
                    int round, const std::vector<Candidate>& fresh, const std::vector<KeptCandidate>& kept) {
  RoundPlan plan;
  plan.round = round;
  nlohmann::json cands = nlohmann::json::array();
  for (const auto& c : fresh) cands.push_back(ToJson(c));
  nlohmann::json kept_json = nlohmann::json::array();
  for (const auto& k : kept)
    kept_json.push_back({{"candidate", ToJson(k.candidate)}, {"model", k.model}, {"result", k.result}});
  std::string prev;
  for (const auto& step : StepNames()) {
    const StepSpec& s = p.steps.at(step);
    const ModuleSpec& mod = m.Module(s.module, "/steps/" + step + "/module");
    Task t;
    t.id = "r" + std::to_string(round) + "-" + step;
    t.step = step;
    t.module = s.module;
    t.ranks = std::min<int64_t>(s.ranks, mod.max_ranks);
    if (step == "load" || step == "store" || step == "select") t.ranks = 1;  // single-writer steps
    if (!prev.empty()) t.after = {prev};
    prev = t.id;
    t.body = {{"format", kTaskFormat}, {"run", run_id}, {"round", round}, {"step", step},
              {"module", s.module},    {"nam", nam_uri}, {"pipeline", p.source}};
    if (step == "train" || step == "store" || step == "evaluate" || step == "select") t.body["candidates"] = cands;
    if (step == "train") t.body["mode"] = s.mode;
    if (step == "evaluate") t.body["shards"] = s.shards > 0 ? s.shards : 2 * t.ranks;
    if (step == "select") {
      t.body["kept"] = kept_json;
      t.body["top_k"] = p.rounds.top_k;
      t.body["metric"] = p.metric;
    }
    plan.tasks.push_back(std::move(t));
  }
  return plan;
}

}  // namespace msaflow::orchestrator
