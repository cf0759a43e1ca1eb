#include "workflow/kinds.h"

#include "common/error.h"
#include "common/strings.h"

namespace msaflow::workflow {

const char* StepName(Step s) {
  switch (s) {
    case Step::kLoad: return "load";
    case Step::kPrepare: return "prepare";
    case Step::kTrain: return "train";
    case Step::kStore: return "store";
    case Step::kEvaluate: return "evaluate";
    case Step::kSelect: return "select";
  }
  return "?";
}

std::optional<Step> StepFromName(std::string_view name) { return ByName(name, StepName, kSteps); }

Step ParseStep(std::string_view name, const std::string& where) {
  if (auto s = StepFromName(name)) return *s;
  Throw(ErrorKind::kInvalidInput, where + ": \"" + std::string(name.substr(0, 40)) +
                                      "\" is not a step (expected load, prepare, train, store, evaluate, select)");
}

bool UsesFpga(Step s) {
  switch (s) {
    case Step::kPrepare:
    case Step::kSelect: return true;
    case Step::kLoad:
    case Step::kTrain:
    case Step::kStore:
    case Step::kEvaluate: return false;
  }
  return false;
}

bool HasCandidates(Step s) {
  switch (s) {
    case Step::kTrain:
    case Step::kStore:
    case Step::kEvaluate:
    case Step::kSelect: return true;
    case Step::kLoad:
    case Step::kPrepare: return false;
  }
  return false;
}

bool SingleWriter(Step s) {
  switch (s) {
    case Step::kLoad:
    case Step::kStore: return true;
    case Step::kPrepare:
    case Step::kTrain:
    case Step::kEvaluate:
    case Step::kSelect: return false;
  }
  return false;
}

bool Divisible(Step s) { return *WorkUnit(s) != '\0'; }

std::vector<Step> DivisibleSteps() {
  std::vector<Step> out;
  for (Step s : kSteps)
    if (Divisible(s)) out.push_back(s);
  return out;
}

const char* WorkUnit(Step s) {
  switch (s) {
    case Step::kPrepare:
      return "image pass";
    case Step::kTrain:
      return "training step";
    case Step::kEvaluate:
      return "(model x shard) task";
    case Step::kLoad:
    case Step::kStore:
    case Step::kSelect:
      return "";
  }
  return "";
}

const char* TrainModeName(TrainMode m) {
  switch (m) {
    case TrainMode::kAuto: return "auto";
    case TrainMode::kIndependent: return "independent";
    case TrainMode::kSync: return "sync";
    case TrainMode::kAsync: return "async";
    case TrainMode::kHybrid: return "hybrid";
  }
  return "?";
}

std::optional<TrainMode> TrainModeFromName(std::string_view name) {
  return ByName(name, TrainModeName,
                {TrainMode::kAuto, TrainMode::kIndependent, TrainMode::kSync, TrainMode::kAsync, TrainMode::kHybrid});
}

const char* StrategyName(Strategy s) {
  switch (s) {
    case Strategy::kPerturb:
      return "perturb";
    case Strategy::kRestart:
      return "restart";
    case Strategy::kRandom:
      return "random";
    case Strategy::kHalving:
      return "halving";
  }
  return "?";
}

std::optional<Strategy> StrategyFromName(std::string_view name) {
  return ByName(name, StrategyName, {Strategy::kPerturb, Strategy::kRestart, Strategy::kRandom, Strategy::kHalving});
}

const char* BackboneKindName(BackboneKind k) {
  switch (k) {
    case BackboneKind::kOnnx:
      return "onnx";
    case BackboneKind::kPixels:
      return "pixels";
  }
  return "?";
}

std::optional<BackboneKind> BackboneKindFromName(std::string_view name) {
  return ByName(name, BackboneKindName, {BackboneKind::kOnnx, BackboneKind::kPixels});
}

const char* FarmKindName(FarmKind k) {
  switch (k) {
    case FarmKind::kCounter:
      return "counter";
    case FarmKind::kDispatcher:
      return "dispatcher";
  }
  return "?";
}

std::optional<FarmKind> FarmKindFromName(std::string_view name) {
  return ByName(name, FarmKindName, {FarmKind::kCounter, FarmKind::kDispatcher});
}

TrainMode ParseTrainMode(std::string_view name, const std::string& where) {
  if (auto m = TrainModeFromName(name)) return *m;
  Throw(ErrorKind::kInvalidInput, where + ": \"" + std::string(name.substr(0, 40)) +
                                      "\" is not one of auto, independent, sync, async, hybrid");
}

namespace {

// What each training mode does, in one exhaustive switch: a new mode is placed here, where
// -Wswitch points, and every question below is answered for it.
struct ModeTraits {
  bool parameter_servers;  // async, hybrid
  bool share_models;       // the ranks train one model together
  bool lockstep;           // every step waits for every rank (sync)
  bool groups;             // ranks in groups, synchronous within (hybrid)
  int64_t min_ranks;
};

ModeTraits Traits(TrainMode m) {
  switch (m) {
    case TrainMode::kAuto:
    case TrainMode::kIndependent: return {false, false, false, false, 1};
    case TrainMode::kSync: return {false, true, true, false, 1};
    case TrainMode::kAsync: return {true, true, false, false, 2};
    case TrainMode::kHybrid: return {true, true, false, true, 4};
  }
  return {false, false, false, false, 1};
}

}  // namespace

bool UsesParameterServers(TrainMode m) { return Traits(m).parameter_servers; }
bool RanksShareModels(TrainMode m) { return Traits(m).share_models; }
bool RanksInLockstep(TrainMode m) { return Traits(m).lockstep; }
bool HasGroups(TrainMode m) { return Traits(m).groups; }
int64_t MinRanks(TrainMode m) { return Traits(m).min_ranks; }

TrainMode ResolveAuto(TrainMode m, int64_t candidates, int64_t ranks) {
  if (m != TrainMode::kAuto) return m;
  return candidates >= ranks ? TrainMode::kIndependent : TrainMode::kSync;
}

}  // namespace msaflow::workflow
