#include "orchestrator/planner.h"

#include <fmt/core.h>

#include "common/error.h"
#include "orchestrator/fpga_preflight.h"
#include "workflow/fpga_config.h"

namespace msaflow::orchestrator {

TrainLayout ResolveTrainLayout(const Pipeline& p, const workflow::StepSpec& s, const ModuleSpec& mod,
                               size_t candidates) {
  const workflow::TrainParallelSpec& ps = s.parallel;
  TrainLayout t;
  t.mode = workflow::ResolveAuto(ps.mode, static_cast<int64_t>(candidates), s.ranks);
  t.ranks = s.ranks;
  if (workflow::UsesParameterServers(t.mode)) {
    t.servers = ps.servers;
    t.max_staleness = ps.max_staleness;
  }
  if (workflow::HasGroups(t.mode)) t.groups = ps.groups;
  if (t.processes() > mod.max_ranks) {
    // The machine gives the module fewer processes than asked: keep the servers, fewer workers.
    int64_t fit = mod.max_ranks - t.servers;
    std::string why = fmt::format("{}: /steps/train/ranks: {} ranks{} need {} processes, but module {} allows {} "
                                  "(max_ranks in the machine file)",
                                  p.name, t.ranks, t.servers ? fmt::format(" + {} server(s)", t.servers) : "",
                                  t.processes(), mod.name, mod.max_ranks);
    switch (t.mode) {
      case TrainMode::kAsync:
        if (fit < workflow::MinRanks(t.mode))
          Throw(ErrorKind::kInvalidInput,
                why + fmt::format("; async needs {} workers besides its servers", workflow::MinRanks(t.mode)));
        break;
      case TrainMode::kHybrid:
        Throw(ErrorKind::kInvalidInput, why + "; hybrid groups need exactly the ranks asked for");
      case TrainMode::kAuto:
      case TrainMode::kIndependent:
      case TrainMode::kSync:
        break;  // any number of ranks
    }
    t.ranks = std::max<int64_t>(1, fit);
  }
  if (ps.straggler_rank >= 0 && ps.straggler_rank < t.ranks) {
    t.straggler_rank = ps.straggler_rank;
    t.straggler_factor = ps.straggler_factor;
  }
  return t;
}

int64_t StepRanks(Step step, const workflow::StepSpec& s, const ModuleSpec& mod) {
  return workflow::SingleWriter(step) ? 1 : std::min<int64_t>(s.ranks, mod.max_ranks);
}

int64_t PerNode(const Machine& m, const ModuleSpec& mod, int64_t processes) {
  return m.OnThisHost() ? processes
                        : (processes + std::max<int64_t>(1, mod.nodes) - 1) / std::max<int64_t>(1, mod.nodes);
}

int64_t RankMemoryOf(const Machine& m, const ModuleSpec& mod, int64_t processes) {
  return mod.memory > 0 ? static_cast<int64_t>(mod.memory) / std::max<int64_t>(1, PerNode(m, mod, processes)) : 0;
}

RoundPlan PlanRound(const Pipeline& p, const Machine& m, const std::string& run_id, const std::string& nam_uri,
                    int round, const std::vector<Candidate>& fresh, const std::vector<KeptCandidate>& kept, bool test) {
  RoundPlan plan;
  plan.round = round;
  nlohmann::json cands = nlohmann::json::array();
  for (const auto& c : fresh) cands.push_back(ToJson(c));
  nlohmann::json kept_json = nlohmann::json::array();
  for (const auto& k : kept)
    kept_json.push_back({{"candidate", ToJson(k.candidate)}, {"model", k.model}, {"result", k.result}});
  const bool finetunes = std::any_of(fresh.begin(), fresh.end(), [](const Candidate& c) { return c.finetune; });
  std::string prev;
  for (const Step step : workflow::kSteps) {
    const std::string name = workflow::StepName(step);
    const StepSpec& s = p.steps.at(step);
    const ModuleSpec& mod = m.Module(s.module, "/steps/" + name + "/module");
    Task t;
    t.id = "r" + std::to_string(round) + "-" + name;
    t.step = step;
    t.module = s.module;
    t.ranks = StepRanks(step, s, mod);
    if (!prev.empty()) t.after = {prev};
    prev = t.id;
    t.body = {{"format", kTaskFormat}, {"run", run_id}, {"round", round}, {"step", name},
              {"module", s.module},    {"nam", nam_uri}, {"pipeline", p.source}};
    if (workflow::HasCandidates(step)) t.body["candidates"] = cands;
    // A round that holds the test split back says so to the steps that would run it (and only
    // then: every other task's body, and so its key, is as it always was).
    if (!test && (step == Step::kPrepare || step == Step::kEvaluate || step == Step::kSelect)) t.body["test"] = false;
    if (workflow::UsesFpga(step)) {  // the steps the DAM's FPGA serves
      t.body["fpga"] = workflow::FpgaConfigToJson(FpgaFor(p, mod));
      if (!m.OnThisHost() && !mod.gres.empty()) t.body["gres"] = mod.gres;  // a job component's GRES
    }
    switch (step) {
      case Step::kTrain: {
        TrainLayout layout = ResolveTrainLayout(p, s, mod, fresh.size());
        // Only where it matters (a fine-tuning round): every other train task's body, and so its
        // key, is as it was before rank_memory was written.
        if (finetunes) layout.rank_memory = RankMemoryOf(m, mod, layout.processes());
        t.ranks = layout.processes();
        t.body["train"] = layout.ToJson();
        break;
      }
      case Step::kEvaluate:
        t.body["shards"] = s.shards > 0 ? s.shards : 2 * t.ranks;
        t.body["farm"] = s.farm;
        // A fine-tuning round's evaluation ranks hold maps within it (as train's, only there).
        if (finetunes && mod.memory > 0) t.body["rank_memory"] = RankMemoryOf(m, mod, t.ranks);
        break;
      case Step::kSelect:
        t.body["kept"] = kept_json;
        t.body["top_k"] = p.rounds.top_k;
        t.body["metric"] = p.metric;
        break;
      case Step::kLoad:
      case Step::kPrepare:
      case Step::kStore: break;
    }
    plan.tasks.push_back(std::move(t));
  }
  return plan;
}

}  // namespace msaflow::orchestrator
