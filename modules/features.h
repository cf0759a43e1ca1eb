// Features objects in the NAM (docs/nam.md): labels (n bytes, padded to 4) then n x dim
// float32, with rows/dim/classes in the metadata; and how a step finds the one it needs
// (internal to modules/).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "modules/step_context.h"
#include "nam/store.h"
#include "workflow/pipeline.h"

namespace msaflow::modules {

struct Features {
  int64_t n = 0, dim = 0, classes = 0;
  std::vector<uint8_t> labels;
  std::vector<float> x;
};

std::string EncodeFeatures(const std::vector<uint8_t>& labels, const std::vector<float>& x);
Features DecodeFeatures(const nam::Object& o);  // throws kCorrupt naming the object

// The digest of a loaded backbone (its NAM object's metadata); kNotFound before the load step.
std::string BackboneDigest(nam::Store& store, const workflow::BackboneSpec& bb);
const workflow::SplitSpec& Split(const workflow::Pipeline& p, const std::string& split);
// The features of `backbone` on `split` (train | test), as prepare stored them.
Features LoadFeatures(StepContext& c, const std::string& backbone, const std::string& split);
// Their shape alone (n, dim, classes; no rows or labels), from the object's metadata.
Features FeaturesShape(StepContext& c, const std::string& backbone, const std::string& split);

}  // namespace msaflow::modules
