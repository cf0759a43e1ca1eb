// Shape arithmetic, evaluated when a plan is compiled. Exported CNNs compute the targets of
// their Reshapes, Pads and Slices at run time from the input's shape (Shape -> Gather ->
// Unsqueeze -> Concat -> Reshape, as torch.onnx writes a channel shuffle with a dynamic batch);
// once a plan's input dims are fixed, every one of those values is a constant. FoldNode
// evaluates such a node on known tensors (graph constants and values folded before it), and the
// helpers below read the attributes-or-inputs of the data-moving operators in every opset form.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "kernels/onnx_graph.h"
#include "kernels/tensor_ops.h"

namespace msaflow::kernels {

// A known tensor by name (a constant, or a value folded for this plan), else nullptr.
using KnownFn = std::function<const ConstTensor*(const std::string&)>;
// The dims of a tensor the plan computes, else nullptr.
using ShapeFn = std::function<const TensorDims*(const std::string&)>;

// Evaluates `n` when every input it reads is known (Shape: when its input's dims are), into
// one tensor per output; false when some input is not known. Throws kUnsupported naming the
// node for an operator FoldNode does not evaluate, kInvalidInput for values that contradict it.
bool FoldNode(const Node& n, const KnownFn& known, const ShapeFn& shape_of, std::vector<ConstTensor>* outs);

// Output dims of Reshape, Flatten, Squeeze and Unsqueeze for an input of `in` (ONNX rules: 0
// copies a dim, -1 is inferred).
TensorDims ReshapedDims(const Node& n, const KnownFn& known, const TensorDims& in);

// A Slice over every axis of an input of `in`: where each axis starts, its step and length.
struct SliceSpec {
  TensorDims start, step, len;
};
SliceSpec ResolveSlice(const Node& n, const KnownFn& known, const TensorDims& in);
// Output `k` of a Split as a slice.
SliceSpec ResolveSplit(const Node& n, const KnownFn& known, const TensorDims& in, size_t k);

// Pad's begin-then-end pads over every axis, its mode and constant value.
struct PadSpec {
  TensorDims pads;
  PadMode mode = PadMode::kConstant;
  float value = 0;
};
PadSpec ResolvePad(const Node& n, const KnownFn& known, size_t rank);

// An integer list given as attribute `attr` (older opsets) or as input `input` (newer ones);
// *present = false when neither is given. Throws when the input is not known.
std::vector<int64_t> IntsArg(const Node& n, size_t input, const std::string& attr, const KnownFn& known, bool* present);

// axis in [-rank, rank) made non-negative; throws naming the node otherwise.
int64_t NormalizeAxis(const Node& n, int64_t axis, size_t rank);

}  // namespace msaflow::kernels
