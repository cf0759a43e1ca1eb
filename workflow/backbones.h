// Backbones checked against the pipeline before a run starts: the model's input (batch, channels,
// size) against what the prepare step will feed it. The load step checks the same.
#pragma once

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

}  // namespace msaflow::workflow
