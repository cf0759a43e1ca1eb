// Fine-tuning in the steps (docs/finetune.md). prepare runs a fine-tuning backbone's frozen trunk
// once per dataset split and caches its activations at the tail's inputs (the maps) in the NAM,
// under a content key like the features'; train trains a candidate's tail with its head on the
// training maps (parallel/finetune.h); evaluate runs the selection and test maps through the
// trained tail. The tail's weights live in the candidate's model object beside its head
// (modules/model_object.h); the frozen trunk stays the backbone the load step stored.
//
// A maps object holds the labels (n bytes); its metadata gives rows, classes, the tail's inputs
// with one image's dims each, part_rows and parts. Its parts (workflow::FeaturesPartObject of
// its name) hold part_rows rows each, a row being every input's values for one image, one input
// after another, float32.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kernels/tail.h"
#include "modules/features.h"
#include "modules/step_context.h"
#include "parallel/finetune.h"
#include "workflow/datasets.h"
#include "workflow/pipeline.h"

namespace msaflow::modules {

// A split's maps in memory, one array per tail input.
struct Maps {
  std::vector<std::string> inputs;
  std::vector<kernels::TensorDims> dims;   // one image's dims per input (C, H, W)
  std::vector<std::vector<float>> values;  // per input: n x the product of its dims
  std::vector<uint8_t> labels;
  std::vector<std::string> class_names;
  int64_t n = 0, classes = 0;
  // The view training and evaluation read.
  parallel::FinetuneData Data() const;
};

// The maps object of backbone `bb` (which has train_from) on `split`.
std::string MapsKey(StepContext& c, const workflow::BackboneSpec& bb, const std::string& split);

// prepare: the maps of every backbone that round c.task.round fine-tunes, on every split the
// round uses, computed (the parts shared over the ranks) where the NAM lacks them. Collective.
// Returns the summary's entries: {backbone, split, object, computed, bytes, seconds}.
nlohmann::json PrepareMaps(StepContext& c);

// The maps object of `idx` (its rows, parts and dtype; labels in the body, the tail's `inputs`
// with one image's dims in the metadata), put by rank 0 once every rank's parts are in the
// NAM, and said (`how` after the ranks: " in 1.2 s"). Returns the maps' bytes. Every rank calls it.
double PutMapsObject(StepContext& c, const workflow::BackboneSpec& bb, const workflow::SplitSource& src,
                     const FeaturesIndex& idx, int64_t classes, const nlohmann::json& inputs, const std::string& how);

// A split's whole maps. kNotFound before prepare made them, kCorrupt for a malformed object.
Maps LoadMaps(StepContext& c, const workflow::BackboneSpec& bb, const std::string& split);

// Backbones' tails (train_from to feature_layer) with their pretrained weights, from the models
// the load step stored, each model fetched and imported once however many candidates need it.
class BackboneTails {
 public:
  explicit BackboneTails(StepContext& c) : c_(c) {}
  // Throws as kernels::Tail does, naming the backbone.
  std::unique_ptr<kernels::Tail> Make(const workflow::BackboneSpec& bb);

 private:
  StepContext& c_;
  std::map<std::string, kernels::Graph> graphs_;  // by backbone name
};

// The pooled features of rows [lo, hi) of `maps` through `tail`, `batch` rows at a time.
std::vector<float> TailFeaturesOf(kernels::Tail* tail, const Maps& maps, int64_t lo, int64_t hi, int64_t batch);

}  // namespace msaflow::modules
