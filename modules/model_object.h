// A trained head in the NAM (a staged or stored model object, docs/formats.md): its weights as
// bytes, its shape and weights layout in the metadata (internal to modules/).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kernels/head.h"
#include "kernels/tail.h"
#include "nam/store.h"

namespace msaflow::modules {

// The head a model object holds, for the configuration it was trained with. Throws kCorrupt
// when its metadata lacks in_dim/classes or its bytes do not fit them, and kInvalidInput when
// an older msaflow wrote it with another weights layout.
kernels::Head HeadFromModel(const nam::Object& m, const kernels::HeadConfig& cfg);

// A fine-tuned model's backbone weights: the tail's (docs/finetune.md), by ONNX initializer name.
struct TailWeights {
  std::string train_from;
  std::vector<std::string> names;
  std::vector<kernels::TensorDims> dims;
  std::vector<std::vector<float>> values;
  bool empty() const { return names.empty(); }
};

// A model object's bytes: the head's serialisation, then, for a fine-tuned model, every tail
// weight (float32, in the tail's order); `meta` gets "tail": {train_from, head_bytes, params:
// [{name, dims}]} then.
std::string ModelBytes(const kernels::Head& h, const kernels::Tail* tail, const std::string& train_from,
                       nlohmann::json* meta);
// The tail weights a model object holds (empty for a head on frozen features). kCorrupt when
// its metadata and bytes disagree.
TailWeights TailOfModel(const nam::Object& m);
// Sets `tail`'s weights to `w`'s. kCorrupt naming `where` when they are not that tail's.
void ApplyTail(const TailWeights& w, kernels::Tail* tail, const std::string& where);

}  // namespace msaflow::modules
