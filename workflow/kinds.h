// The closed sets a pipeline and a task choose from, as types: the workflow's steps, the
// train step's parallel modes, the rounds' strategy, a backbone's kind and the evaluate step's farm. Each is parsed
// from its JSON name once (here, by the parsers in this folder) and compared as an enum everywhere else, in `switch`es
// the compiler checks for exhaustiveness (-Wswitch). The FPGA backend is kernels::fpga::Backend
// (kernels/fpga/device.h), parsed in workflow/fpga_config.cc.
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace msaflow::workflow {

// The five steps of a round (docs/design-notes.md), in the order they run; "load" is step 1's first
// half, "prepare" its FPGA half.
enum class Step { kLoad, kPrepare, kTrain, kStore, kEvaluate, kSelect };
inline constexpr std::array<Step, 6> kSteps = {Step::kLoad,  Step::kPrepare,  Step::kTrain,
                                               Step::kStore, Step::kEvaluate, Step::kSelect};

// "load", "prepare", "train", "store", "evaluate", "select".
const char* StepName(Step s);
std::optional<Step> StepFromName(std::string_view name);
// Throws Error(kInvalidInput) "<where>: \"<name>\" is not a step (expected load, prepare, ...)".
Step ParseStep(std::string_view name, const std::string& where);
// The steps whose work is the DAM FPGA's (prepare, select); they get a task's FPGA settings.
bool UsesFpga(Step s);
// The steps that read the round's candidates (train, store, evaluate, select).
bool HasCandidates(Step s);
// The steps that always run on one rank: they write the NAM alone (load, store).
bool SingleWriter(Step s);
// The steps whose work divides among their ranks (prepare's image passes, train's updates,
// evaluate's (model x shard) tasks): the ones placement, `msaflow scaling` and the simulator give
// more ranks. The others run on one rank or do work that more ranks do not shorten.
bool Divisible(Step s);
// Those steps, in the order they run (kSteps filtered by Divisible).
std::vector<Step> DivisibleSteps();
// The unit of a divisible step's work ("image pass", "training step", "(model x shard) task");
// "" for the others.
const char* WorkUnit(Step s);

// How the train step uses its ranks (docs/parallel.md). kAuto exists only in a pipeline; the
// planner resolves it to independent or sync before a task is written.
enum class TrainMode { kAuto, kIndependent, kSync, kAsync, kHybrid };
// "auto", "independent", "sync", "async", "hybrid".
const char* TrainModeName(TrainMode m);
std::optional<TrainMode> TrainModeFromName(std::string_view name);
// Throws Error(kInvalidInput) "<where>: \"<name>\" is not one of auto, independent, ...".
TrainMode ParseTrainMode(std::string_view name, const std::string& where);
// What each mode does with its ranks, for the code that must choose (a new mode is added here,
// in kinds.cc's switches, and then wherever -Wswitch points). kAuto answers as no mode does:
// false, 1; it never reaches a task.
// async and hybrid: the modes with parameter-server processes beside the gradient ranks.
bool UsesParameterServers(TrainMode m);
// sync, async and hybrid: the ranks train each model together (one model, its batches split over
// them); independent: each rank trains models of its own, whole.
bool RanksShareModels(TrainMode m);
// sync: every update is one allreduce over all the ranks, which step in lockstep.
bool RanksInLockstep(TrainMode m);
// hybrid: the ranks in synchronous groups, asynchronous across them.
bool HasGroups(TrainMode m);
// The fewest gradient ranks the mode trains with: async 2 (workers that do not wait for each
// other), hybrid 4 (2 groups of 2), the others 1.
int64_t MinRanks(TrainMode m);
// kAuto resolved for a step with `ranks` ranks and `candidates` models to train: each rank its
// own models (independent) while there are at least as many models as ranks, else sync. Any
// other mode as it is.
TrainMode ResolveAuto(TrainMode m, int64_t candidates, int64_t ranks);

// How each round after the first chooses its candidates (docs/search.md): perturb the best
// kept ones, restart from fresh samples, sample at random, or successive halving (rung 0 ranks
// the backbones, each round continues the best 1/eta of the last round's heads).
enum class Strategy { kPerturb, kRestart, kRandom, kHalving };
// "perturb", "restart", "random", "halving".
const char* StrategyName(Strategy s);
std::optional<Strategy> StrategyFromName(std::string_view name);

// What a backbone is: an ONNX model cut at a layer, or raw pixels (the baseline).
enum class BackboneKind { kOnnx, kPixels };
// "onnx", "pixels".
const char* BackboneKindName(BackboneKind k);
std::optional<BackboneKind> BackboneKindFromName(std::string_view name);

// How the evaluate step's ranks share its tasks (parallel/task_farm.h): each takes the next
// from a shared counter, or rank 0 hands them out.
enum class FarmKind { kCounter, kDispatcher };
// "counter", "dispatcher".
const char* FarmKindName(FarmKind k);
std::optional<FarmKind> FarmKindFromName(std::string_view name);

// In JSON (task files, the journal, results) both are written by name. There is no from_json:
// reading one goes through Parse*/FromName, which say what was expected.
inline void to_json(nlohmann::json& j, Step s) { j = StepName(s); }
inline void to_json(nlohmann::json& j, TrainMode m) { j = TrainModeName(m); }
inline void to_json(nlohmann::json& j, Strategy s) { j = StrategyName(s); }
inline void to_json(nlohmann::json& j, BackboneKind k) { j = BackboneKindName(k); }
inline void to_json(nlohmann::json& j, FarmKind k) { j = FarmKindName(k); }

}  // namespace msaflow::workflow
