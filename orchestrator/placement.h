// Placement from measured costs: what each step cost in a run (work that ranks share, work
// they do not, the cost of starting a process), and ranks per step chosen from those figures and
// the machine's limits with the reason for each.
// Pure: results JSON in, figures and decisions out (the CLI reads and prints them).
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "workflow/machine.h"
#include "workflow/pipeline.h"

namespace msaflow::orchestrator {

using workflow::Machine;
using workflow::ModuleSpec;

// One step's measured cost in one round.
struct StepCost {
  workflow::Step step = workflow::Step::kLoad;
  int64_t ranks = 1;      // the ranks it ran with
  double wall_s = 0;      // the step's wall time (launch to exit)
  double work_s = 0;      // rank-seconds of work the ranks shared (divides by the ranks)
  int64_t items = 0;      // ... over this many items
  std::string unit;       // workflow::WorkUnit(step): "image pass", ...; "" for a step that does not divide
  double serial_s = 0;    // the rest: start-up, reading datasets, committing (does not divide)
  double PerItem() const { return items ? work_s / static_cast<double>(items) : 0; }
};

// The part of a prepare summary's features entry that is its own: 1 for a backbone prepared
// alone; 1/K for each of K cuts of one model prepared in one pass, whose entries each carry the
// pass's seconds (one_pass_with names the others).
double PassShare(const nlohmann::json& features_entry);

// The costs of a round as `msaflow run` records them in its results ("costs"): from the
// step summaries (features, training, evaluation) and step_seconds of that round.
// Steps without shared work (load, store, select; prepare when every feature was reused)
// have work_s 0; a step_seconds name that is no step is left out.
std::map<workflow::Step, StepCost> MeasureRound(const nlohmann::json& round, const workflow::Pipeline& p);
nlohmann::json ToJson(const StepCost& c);
StepCost StepCostFromJson(const nlohmann::json& j, const std::string& where);

// Ranks for prepare, train and evaluate from the simulator's model calibrated on earlier runs
// (simulate::FavouredRanks, keyed by step name: per step the model's seconds at 1, 2, 4 ... ranks), within each
// module's max_ranks, for the local launcher this machine's cores, and for train trained
// independently the round's candidates: the next rank count is taken while it saves >= 5 % in
// the model. `why` has one line per step; `source` says which runs calibrated the model.
struct Placement {
  std::map<workflow::Step, int64_t> ranks;
  std::vector<std::string> why;
  std::string source;  // what calibrated the model, or "no earlier run"
};
Placement PlaceFromModel(const workflow::Pipeline& p, const Machine& m, const nlohmann::json& favoured,
                         const std::string& source, unsigned cores);
// With no earlier run: every divisible step on the module's limit.
Placement PlaceWithoutCosts(const workflow::Pipeline& p, const Machine& m, unsigned cores);
// The pipeline with the placement's ranks (train's mode auto re-resolved by the planner).
workflow::Pipeline ApplyPlacement(workflow::Pipeline p, const Placement& pl);

}  // namespace msaflow::orchestrator
