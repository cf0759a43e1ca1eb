// Features in the NAM (docs/nam.md) and how a step finds and reads the ones it needs (internal
// to modules/).
//
// A features object `features/<backbone digest>-<dataset digest>` holds the labels (n bytes);
// its metadata gives rows, dim, classes, part_rows and parts. The rows are in `parts` part
// objects (workflow::FeaturesPartObject) of part_rows x dim values each (the last one
// shorter), written before the features object itself, so once it is there every part is. The
// values are float32, or float16 where the metadata says "dtype": "f16" (the backbone's
// feature_dtype): half the NAM memory and transfer; readers get float32 either way.
// A step reads only the parts that hold its rows, fetching the next one while it computes on
// the current (common/overlap.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/overlap.h"
#include "kernels/head.h"
#include "modules/step_context.h"
#include "nam/store.h"
#include "workflow/pipeline.h"

namespace msaflow::modules {

// A features object's shape and labels.
struct FeaturesIndex {
  std::string object;
  int64_t n = 0, dim = 0, classes = 0, part_rows = 0, parts = 0;
  bool half = false;            // parts hold float16 values
  std::vector<uint8_t> labels;  // empty when only the shape was asked for
  std::vector<std::string> class_names;  // an image folder's, by class index; empty otherwise
  int64_t PartLo(int64_t p) const { return p * part_rows; }
  int64_t PartHi(int64_t p) const { return std::min(n, (p + 1) * part_rows); }
};

// A whole split's features in memory.
struct Features {
  int64_t n = 0, dim = 0, classes = 0;
  std::vector<uint8_t> labels;
  std::vector<float> x;
};

// The metadata of a features object (checked by OpenFeatures).
nlohmann::json FeaturesMeta(int64_t n, int64_t dim, int64_t classes, int64_t part_rows, bool half);

// The digest of a loaded backbone (its NAM object's metadata); kNotFound before the load step.
std::string BackboneDigest(nam::Store& store, const workflow::BackboneSpec& bb);
std::string FeaturesKey(StepContext& c, const std::string& backbone, const std::string& split);

// The shape of `backbone`'s features on `split` (train | test) from the object's metadata
// (no labels read); kNotFound before the prepare step, kCorrupt for a malformed object.
FeaturesIndex FeaturesShape(StepContext& c, const std::string& backbone, const std::string& split);
// The shape and the labels.
FeaturesIndex OpenFeatures(StepContext& c, const std::string& backbone, const std::string& split);
// ... of the features object named `key`.
FeaturesIndex OpenFeaturesObject(nam::Store& store, const std::string& key);
// Features of `backbone` as float16 into `out` (resized to n); kInvalidInput naming the
// backbone when a value is past float16's range (65504) or not a number, since it would be
// stored as an infinity.
void NarrowFeatures(const std::string& backbone, const float* x, size_t n, std::vector<uint16_t>& out);
// Reads part `p` into `bytes` (reusing its memory) and checks its size against the index;
// the rows are then at bytes.data() as float32 (float16 parts are widened as they are read).
void ReadFeaturesPart(nam::Store& store, const FeaturesIndex& f, int64_t p, std::string& bytes);
// Multiply-adds of head `h` on one row of `dim` features into `classes` outputs (its forward
// pass): what the coordinator weighs a train or evaluate step by (StepContext::CheckSmall).
double HeadMacsPerRow(const kernels::HeadConfig& h, int64_t dim, int64_t classes);
// A split's whole features, reading part i + 1 while part i is copied.
Features LoadFeatures(StepContext& c, const std::string& backbone, const std::string& split);
// The whole features object named `key`, part i + 1 read while part i is copied where `reading`
// decides so (common/overlap.h).
Features LoadFeaturesObject(nam::Store& store, const std::string& key, OverlapChoice& reading);

}  // namespace msaflow::modules
