// The planner: a pipeline, a machine and a round's candidates become the round's tasks, each
// bound to a module (cm/esb/dam) with its rank count, in dependency order (a chain here:
// load -> prepare -> train -> store -> evaluate -> select). Pure: no processes, no files.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "workflow/machine.h"
#include "workflow/candidates.h"
#include "workflow/objects.h"
#include "workflow/pipeline.h"
#include "workflow/task.h"

namespace msaflow::orchestrator {

// The orchestrator plans with the workflow's types.
using workflow::BackboneSpec;
using workflow::Machine;
using workflow::ModuleSpec;
using workflow::RoundPlan;
using workflow::Task;
using workflow::Candidate;
using workflow::Pipeline;
using workflow::Ranked;
using workflow::Step;
using workflow::TrainMode;
using workflow::StepSpec;
using workflow::KeptModel;
using workflow::TrainLayout;
using workflow::kTaskFormat;
using workflow::BestObject;
using workflow::ModelObject;
using workflow::PreparedObject;
using workflow::ResultObject;
using workflow::CandidateFromJson;
using workflow::FirstRound;
using workflow::HeadLabel;
using workflow::NextRound;
using workflow::ToJson;

struct KeptCandidate {
  Candidate candidate;
  std::string model;   // NAM model object
  std::string result;  // NAM result object
};

// The train step's layout for `candidates` candidates on machine module `mod`: mode auto
// resolved (independent when candidates >= ranks, else sync), ranks capped by the module's
// max_ranks (servers included). Throws kInvalidInput when the capped ranks break the mode.
TrainLayout ResolveTrainLayout(const Pipeline& p, const workflow::StepSpec& s, const ModuleSpec& mod,
                               size_t candidates);

// The processes a step other than train starts on module `mod`: one for a step that writes alone
// (workflow::SingleWriter), else the step's ranks capped by the module's max_ranks.
int64_t StepRanks(workflow::Step step, const workflow::StepSpec& s, const ModuleSpec& mod);
// Of a step's `processes` on module `mod`, those on one node: every one on this host (a local
// machine), else the processes spread over the module's nodes.
int64_t PerNode(const Machine& m, const ModuleSpec& mod, int64_t processes);
// The bytes each of them may take: the node's memory shared among them (0 where the machine
// file gives no memory). PlanRound puts it in a fine-tuning round's train task
// (TrainLayout::rank_memory) and evaluate task (TaskSpec::rank_memory).
int64_t RankMemoryOf(const Machine& m, const ModuleSpec& mod, int64_t processes);

// `test` false: the round holds the test split back (workflow::TaskSpec::test; a halving round
// that cannot be the run's last, RoundLoop::TestsInRound).
RoundPlan PlanRound(const Pipeline& p, const Machine& m, const std::string& run_id, const std::string& nam_uri,
                    int round, const std::vector<Candidate>& fresh, const std::vector<KeptCandidate>& kept,
                    bool test = true);

}  // namespace msaflow::orchestrator
