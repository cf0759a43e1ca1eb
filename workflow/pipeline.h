// A pipeline: what to run (datasets, backbones, head search space, steps, rounds). Parsed
// and validated once, then immutable. docs/pipeline.md and configs/schema/pipeline.schema.json
// describe the format; every error names the JSON pointer.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/fpga/device.h"
#include "kernels/precision.h"
#include "kernels/prepare.h"
#include "workflow/kinds.h"

namespace msaflow::workflow {

inline constexpr char kPipelineFormat[] = "msaflow.pipeline/1";

struct SplitSpec {
  std::string format = "idx";  // idx | npy | folder
  std::string images, labels;  // idx, npy: absolute paths
  std::string root;            // folder: root/<class>/<image>.png|jpg, absolute
  int64_t limit = 0;           // 0 = all
  // validation only: taken from the training split instead (stratified), when fraction > 0
  double fraction = 0;
  uint64_t seed = 1;
  bool from_train() const { return fraction > 0; }
  // train only: a stratified part of the split ({"subset": {"fraction", "seed"}}): each class's
  // first round(fraction x its images) of a seeded order, at least kSubsetMinPerClass. A smaller
  // fraction's rows are among a larger one's (the halving strategy grows its rounds' data so).
  double subset_fraction = 1;
  uint64_t subset_seed = 1;
  bool subset() const { return subset_fraction < 1; }
  // The file or folder, for messages.
  const std::string& origin() const { return format == "folder" ? root : images; }
};

// A subset keeps at least this many images of a class (all of a class with fewer).
inline constexpr int64_t kSubsetMinPerClass = 10;

// Raw pixels resized to "input" give at most this many features an image (512 x 512 x 3 fits).
constexpr int64_t kMaxPixelFeatures = int64_t{1} << 20;

struct BackboneSpec {
  std::string name;
  BackboneKind kind = BackboneKind::kOnnx;
  std::string onnx;           // absolute path
  std::string feature_layer;
  // The images' size for the model; for raw pixels, given or not: with it every image is resized
  // to it (then the pixels, channel-planar, are the features), without it they are taken as read.
  kernels::InputSpec input;
  // The images go through preparation (resize, channels, normalisation): every ONNX backbone, and
  // raw pixels with an "input".
  bool prepared() const { return kind != BackboneKind::kPixels || input.height > 0; }
  // The executor's arithmetic: "f32", "bf16" (AVX-512 CPUs) or "int8" (VNNI CPUs; calibrated on the
  // first training images when loaded) (kernels/executor.h).
  kernels::Precision precision = kernels::Precision::kF32;
  // How prepare stores the features in the NAM: "f32", or "f16" (half the memory).
  std::string feature_dtype = "f32";
  // Fine-tuning (docs/finetune.md): the layer from which on, up to feature_layer, the backbone
  // trains with the head; "" = frozen. The trunk before it runs once per dataset, its activations
  // at the tail's inputs cached in the NAM (the maps).
  std::string train_from;
  bool finetunes() const { return !train_from.empty(); }
  std::string pointer;  // where the pipeline JSON gives it ("/backbones/1"; several share one when
                        // "feature_layer" lists layers: one backbone per layer)
};

struct HeadSpace {
  std::vector<std::string> types{"softmax"};
  std::vector<int64_t> hidden{128};
  std::vector<std::string> optimizers{"adam"};
  std::vector<double> lr{1e-3};
  std::vector<double> l2{1e-4};
  std::vector<int64_t> epochs{20};
  int64_t batch = 64;
  // A fine-tuning candidate's backbone learning rate, as a multiple of its head's (searched).
  std::vector<double> backbone_lr_scale{0.1};
  // A fine-tuning candidate's epochs (searched; the recipe's second phase is short); empty: as
  // `epochs`.
  std::vector<int64_t> finetune_epochs;
};

// How the train step uses its ranks (docs/parallel.md).
struct TrainParallelSpec {
  // auto: independent when the round has at least as many candidates as ranks, else sync.
  TrainMode mode = TrainMode::kAuto;
  int64_t servers = 1;         // async, hybrid: parameter-server processes started beside `ranks`
  int64_t groups = 2;          // hybrid: synchronous groups of ranks/groups ranks each
  int64_t max_staleness = 16;  // async, hybrid: updates a gradient may lag before it is refused
  // Experiment knob: slow gradient rank `straggler_rank` by `straggler_factor` (1 = off).
  int64_t straggler_rank = -1;
  double straggler_factor = 1;
};

struct StepSpec {
  std::string module;
  int64_t ranks = 1;           // train: the ranks that compute gradients
  bool ranks_given = false;    // the pipeline says "ranks" (else a default the machine may lower)
  TrainParallelSpec parallel;  // train only
  int64_t shards = 0;          // evaluate only; 0 = 2 per rank
  FarmKind farm = FarmKind::kCounter;  // evaluate only (parallel/task_farm.h)
};

struct RoundsSpec {
  int64_t max = 1;
  int64_t candidates = 4;
  int64_t top_k = 2;
  Strategy strategy = Strategy::kPerturb;  // docs/search.md
  // halving: rung 0 ranks the backbones on a stratified `rank_fraction` of the training split by
  // `rank_by` ("knn" | "logme") and keeps the best 1/eta; each round then continues the best
  // 1/eta of the last round's heads (warm-started) for eta times the epochs.
  int64_t eta = 3;
  double rank_fraction = 0.1;
  std::string rank_by = "knn";
  // halving: round r trains on a stratified 1/eta^(max - r) of the training split (at least
  // rank_fraction; the last round on all of it), nested, so that the backbones dropped on the
  // way are never run over all the images (workflow::HalvingDataFraction).
  bool grow_data = true;
  double min_delta = 0.0;
  double backbone_margin = 0.02;  // a backbone this close behind the champion keeps a parent (candidates.h)
  // From this round on, the candidates of a backbone with "train_from" fine-tune it (before it,
  // their heads train on frozen features: the two phases of transfer learning). 1 = from the start.
  int64_t finetune_from_round = 1;
  int64_t patience = 1;
  uint64_t seed = 1;
};

// What a launcher does when a round's job ends badly (Slurm states; docs/pipeline.md).
// How often a failed task (a round's job under Slurm) is started again, and for which reasons:
// Slurm's end states, and for a local step FAILED (a non-zero exit status) or SIGNALED (ended
// by a signal: the OOM killer, a watchdog).
struct RetrySpec {
  int64_t max = 0;
  std::vector<std::string> on = {"NODE_FAIL", "PREEMPTED", "TIMEOUT", "CANCELLED", "SIGNALED"};
};

struct Pipeline {
  std::string name;
  RetrySpec retries;
  std::string machine = "local";
  std::string nam;  // "" = the default store of the runs directory
  SplitSpec train, test;
  std::optional<SplitSpec> validation;  // selection data (docs/pipeline.md "Validation")
  std::string select_on = "validation";  // validation | test (then the reported figure is optimistic)
  int64_t classes = 0;                   // 0 = 1 + the largest label of any split
  std::vector<BackboneSpec> backbones;
  HeadSpace head;
  std::map<Step, StepSpec> steps;  // every step, in the order they run
  RoundsSpec rounds;
  std::string metric = "accuracy";
  std::optional<kernels::fpga::Backend> fpga;  // overrides the machine's FPGA backend; none = the machine's
  nlohmann::json source;  // as submitted, with paths made absolute

  const BackboneSpec& Backbone(const std::string& name) const;
  // Whether round `round`'s candidates on backbone `bb` fine-tune it.
  bool FinetunesIn(const BackboneSpec& bb, int round) const {
    return bb.finetunes() && round >= rounds.finetune_from_round;
  }
  // The step named `name` as a record spells it ("train"), or null for a name that is no step.
  const StepSpec* FindStep(std::string_view name) const;
  StepSpec* FindStep(std::string_view name);
  // The step, or null where the pipeline has none.
  const StepSpec* FindStep(Step s) const {
    auto it = steps.find(s);
    return it == steps.end() ? nullptr : &it->second;
  }
  StepSpec* FindStep(Step s) {
    auto it = steps.find(s);
    return it == steps.end() ? nullptr : &it->second;
  }
};

// Parses and validates. `origin` names the file in errors; relative paths resolve against
// `base_dir`. Throws Error(kInvalidInput) "<origin>: <pointer>: <problem>".
Pipeline ParsePipeline(const std::string& text, const std::string& origin, const std::string& base_dir);
Pipeline LoadPipeline(const std::string& path);
// Rebuilds a pipeline from its `source` JSON (paths already absolute), as tasks carry it.
Pipeline PipelineFromSource(const nlohmann::json& source);
// `p` with only the backbones named in `keep` (by their names: "<name>.<layer>" for a layer of
// a feature_layer list, which keeps its name), its source rewritten to match; the halving
// strategy's survivors. Throws kInternal when none would be left.
Pipeline KeepBackbones(const Pipeline& p, const std::set<std::string>& keep);

}  // namespace msaflow::workflow
