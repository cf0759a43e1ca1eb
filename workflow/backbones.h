// Backbones checked against the pipeline before a run starts: the model's input (batch, channels,
// size) against what the prepare step will feed it. The load step checks the same.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/executor.h"
#include "kernels/onnx_graph.h"
#include "workflow/pipeline.h"

namespace msaflow::workflow {

// Throws kInvalidInput naming the backbone and its file: a fixed batch size other than the
// steps' batch (64, or input.batch), or a fixed channel count or image size other than the
// pipeline's input.
void CheckBackboneInput(const kernels::Graph& g, const BackboneSpec& bb);

// Imports every ONNX backbone of `p` (feature layer, operators the executor runs) and checks its
// input as above: what `validate` and a run do before anything starts.
void CheckBackbones(const Pipeline& p);

// A fine-tuning backbone's tail as `plan` and `validate` describe it (docs/finetune.md).
struct TailShape {
  std::vector<std::string> layers;      // the tail's nodes, in graph order
  int64_t weights = 0;                  // values that train
  std::vector<std::string> inputs;      // the trunk tensors cached (the maps)
  std::vector<std::vector<int64_t>> dims;  // one image's dims of each (C, H, W)
  int64_t values = 0;                   // maps values per image
  int64_t kept_values = 0;              // floats a training step keeps per image (kernels::Tail::KeptValues)
};
// Imports bb.onnx and describes its tail at the pipeline's input size; throws as CheckBackbones.
TailShape DescribeTail(const BackboneSpec& bb);

// Whether one pass of a model over the images can give both backbones' features: one ONNX file
// cut at two layers, prepared alike (input size, mean, std, fixed batch), both in f32. Rank and
// prepare run such backbones together (Executor::FeaturesOfCuts).
bool SharePass(const BackboneSpec& a, const BackboneSpec& b);

// The backbones of `p` in groups that one pass can serve (each SharePass with its group's first),
// in the pipeline's order; a backbone that shares with none is a group of its own.
std::vector<std::vector<const BackboneSpec*>> PassGroups(const Pipeline& p);

// One pass over the images: its backbones and, for several cuts of one model, the executor that
// gives them all (null: one backbone, run by an executor of its own).
struct Pass {
  std::vector<const BackboneSpec*> bbs;
  std::shared_ptr<kernels::Executor> ex;
};
using CutsExecutorFn = std::function<std::shared_ptr<kernels::Executor>(const std::vector<const BackboneSpec*>&)>;
// How one group of PassGroups runs: together where one pass computes each cut exactly as the
// model cut there alone would (Executor::CutsAsAlone); each other cut alone. `cuts_executor`
// makes the executor of several cuts, or null where it cannot (then every cut runs alone).
std::vector<Pass> PlanPasses(std::vector<const BackboneSpec*> group, const CutsExecutorFn& cuts_executor);

// The content key of what backbone `bb` gives (its NAM object's "digest", and so part of every
// features object's name): the model's bytes (`model`; ignored for kind pixels), the feature
// layer, the input preparation, the fixed batch, the precision and the features' storage type.
// int8 depends on its calibration images too: `calibration` says which (the load step's
// " calibrated on <train digest> x<images>"; empty for other precisions). The load step names backbones by it; rung 0 of
// the halving strategy names the subset features it hands to prepare by it (docs/search.md).
std::string BackboneDigestOf(const BackboneSpec& bb, const std::string& model, const std::string& calibration);

// Whether `split`'s fine-tuning maps (modules/finetune_maps.h) are stored as float16: every
// split's, where the backbone's feature_dtype is "f16" (half the NAM bytes and transfer; readers
// widen them). The fine-tuned model a run exports, predicts and serves with then rounds the
// trunk's output through float16 where the tail reads it (kernels::RoundThroughHalfAt), so that
// it computes what evaluation computed from the stored maps, and counts the run's accuracy.
bool MapsInHalf(const BackboneSpec& bb, const std::string& split);

// How a training rank holds a split's maps of `maps_bytes` (as stored) when it may take `limit`
// bytes for them (0: no limit): 0, whole (each part kept once read); else streamed, holding at
// most about the bytes returned (modules::MapsSource).
inline int64_t MapsKeepBytes(int64_t maps_bytes, int64_t limit) { return limit > 0 && maps_bytes > limit ? limit : 0; }

// The images of a batch that evaluation runs through a fine-tuned tail: an evaluation rank holds
// the tail's activations for them beside its maps.
inline constexpr int64_t kEvaluateBatch = 64;

}  // namespace msaflow::workflow
