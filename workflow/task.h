// A task file (`msaflow module <step> --task FILE`, format msaflow.task/1, docs/formats.md):
// what one step of one round does. The planner writes it; the module reads it with
// ParseTask, which checks every field so a bad file is one clear error, never a crash.
#pragma once

#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kernels/fpga/device.h"
#include "workflow/candidates.h"
#include "workflow/kinds.h"
#include "workflow/pipeline.h"

namespace msaflow::workflow {

inline constexpr char kTaskFormat[] = "msaflow.task/1";

// The train step's parallel layout as the planner resolved it (mode "auto" is never left).
struct TrainLayout {
  TrainMode mode = TrainMode::kIndependent;  // never kAuto
  int64_t ranks = 1;                 // ranks computing gradients
  int64_t servers = 0;               // parameter-server ranks (async, hybrid), started beside them
  int64_t groups = 1;                // hybrid: synchronous groups
  int64_t max_staleness = 0;
  int64_t straggler_rank = -1;       // experiment knob (docs/parallel.md)
  double straggler_factor = 1;
  // Bytes each training process may take (the module's memory shared by its processes on a
  // node; 0: the machine file gives no memory): a fine-tuning rank streams its training maps
  // when they would not fit beside the tail's activations (workflow::MapsKeepBytes).
  int64_t rank_memory = 0;
  int64_t processes() const { return ranks + servers; }
  // The rows of a batch of `batch` that one rank computes: sync splits a batch over the ranks,
  // hybrid over a group's, the others compute whole batches.
  int64_t BatchShare(int64_t batch) const;
  // What a fine-tuning rank may take for its training maps: rank_memory less `activations`
  // bytes, at least 1; 0 (no limit) where rank_memory is 0.
  int64_t MapsLimit(int64_t activations) const {
    return rank_memory > 0 ? std::max<int64_t>(1, rank_memory - activations) : 0;
  }
  nlohmann::json ToJson() const;
};

struct KeptModel {
  nlohmann::json candidate;  // as candidates are written
  std::string model, result;
};

struct TaskSpec {
  Step step = Step::kLoad;
  std::string run, module, nam;
  int round = 0;
  Pipeline pipeline;
  std::vector<Candidate> candidates;  // train, store, evaluate, select
  std::vector<KeptModel> kept;        // select
  int64_t shards = 1;                 // evaluate
  FarmKind farm = FarmKind::kCounter;  // evaluate
  // evaluate: the bytes each rank may take (its module's memory shared by the ranks on a node;
  // 0: no limit), written only in a fine-tuning round: the maps it holds stay within it.
  int64_t rank_memory = 0;
  int64_t top_k = 1;                  // select
  std::string metric = "accuracy";    // select
  TrainLayout train;                  // train
  kernels::fpga::Config fpga;         // prepare, select: the FPGA backend (the module's, or the pipeline's override)
  std::string gres;                   // under Slurm: the GRES the step's job component asked for ("fpga:1")
  // prepare, evaluate, select: whether the round runs the test split. False only in a halving
  // round that cannot be the run's last (orchestrator/rounds.h, RoundLoop::TestsInRound): no test
  // image goes through a backbone that may leave the race, and no head is scored on test.
  bool test = true;
};

// One task of a round as the planner made it and a launcher runs it: a step bound to a module
// with its rank count, in dependency order.
struct Task {
  std::string id;      // "r<round>-<step>"
  Step step = Step::kLoad;
  std::string module;  // cm | esb | dam
  int64_t ranks = 1;  // processes started (for train: gradient ranks + parameter servers)
  std::vector<std::string> after;  // task ids that must finish first
  nlohmann::json body;             // the task file given to `msaflow module <step> --task`
};

// A round's tasks, in the order they run.
struct RoundPlan {
  int round = 0;
  std::vector<Task> tasks;
};

// Throws Error(kInvalidInput) "<origin>: <field>: <problem>" for anything missing or mistyped.
TaskSpec ParseTask(const nlohmann::json& body, const std::string& origin);
// The task's content key: a checksum of its body without the NAM address (which a resumed run's
// new NAM server changes). Equal keys mean the same work on the same inputs.
std::string TaskKey(const nlohmann::json& body);
TrainLayout TrainLayoutFromJson(const nlohmann::json& j, const std::string& where);

}  // namespace msaflow::workflow
