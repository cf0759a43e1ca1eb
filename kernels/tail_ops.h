// The operators of a trainable tail (kernels/tail.h), each with a forward pass that keeps what
// its backward pass needs and a backward pass to the gradients of its inputs and weights.
// Convolutions and pooling run on oneDNN's training primitives (forward_training,
// backward_data, backward_weights; blocked layouts where oneDNN prefers them); the elementwise,
// broadcasting, normalisation and reshaping operators are plain loops over row-major tensors.
// Every image tensor between operators is float32 channels-last (N, H, W, C in memory), the
// layout oneDNN's convolution and pooling kernels take without reordering; the others are plain
// row-major.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kernels/onnx_graph.h"
#include "kernels/tensor_ops.h"

namespace msaflow::kernels {

// A float tensor: dims in ONNX's order (NCHW for images); with `cl` (4-D only) its values are
// stored channels-last (N, H, W, C), else row-major in the order of dims.
struct Act {
  TensorDims dims;
  std::vector<float> v;
  bool cl = false;
};

// The dims of `a` in memory order (N, H, W, C for a channels-last tensor).
TensorDims MemoryDims(const Act& a);
// NCHW (dims d) to channels-last, and back.
void ToChannelsLast(const float* nchw, const TensorDims& d, float* nhwc);
void ToChannelsFirst(const float* nhwc, const TensorDims& d, float* nchw);

// A weight an operator reads: its values, and where its gradient goes (nullptr: frozen).
struct WeightRef {
  const std::vector<float>* value = nullptr;
  std::vector<float>* grad = nullptr;
  TensorDims dims;
};

// Where the gradient of one input goes: nullptr where none is wanted (a constant, a frozen
// input); `add` when an earlier consumer has written its part already (residual branches).
struct GradOut {
  Act* t = nullptr;
  bool add = false;
};

// An activation a convolution can apply to its own output: y = min(max(x, lo), hi) (ReLU: lo 0,
// hi infinite). Its gradient passes where lo < y < hi, read from the activated output: the
// convention of PyTorch's relu and hardtanh (none at the bounds), the same as from the input.
struct Activation {
  float lo = 0, hi = 0;
};
// The activation node `n` computes, where it is one a convolution can take over (Relu; Clip with
// constant bounds lo < hi); std::nullopt otherwise.
std::optional<Activation> FusableActivation(const Graph& g, const Node& n);

class TailOp {
 public:
  virtual ~TailOp() = default;
  // Takes over the activation that alone reads this operator's output (kernels/tail.h): Forward
  // then writes the activated values, and Backward receives them as `out`, with the gradient
  // with respect to them as `dout`. False where the operator cannot.
  virtual bool Fuse(const Activation&) { return false; }
  // Floats the last Backward needed beside the tail's tensors, in the two buffers the ops of a
  // thread share (they run one at a time): the gradient before a fused activation, and a
  // gradient to add into one already written. The largest of each counts once (Tail::KeptValues).
  struct ScratchUse {
    int64_t grad = 0, add = 0;
  };
  virtual ScratchUse Scratches() const { return {}; }
  // Computes out (dims and values) from the inputs, keeping what Backward needs. Throws
  // kInvalidInput naming the node for inputs whose shapes the operator does not take.
  virtual void Forward(const std::vector<const Act*>& in, Act* out) = 0;
  // After Forward on the same inputs: adds the weights' gradients to their grads and writes
  // (or, with GradOut::add, adds) each wanted input gradient. dout has out's dims.
  virtual void Backward(const std::vector<const Act*>& in, const Act& out, const Act& dout,
                        const std::vector<GradOut>& din) = 0;
};

// The operators with a backward pass (the names of ONNX's operators).
bool HasBackward(const std::string& op);

// The weight inputs of `n` that training may change (Conv's W and B, BatchNormalization's scale
// and B, Gemm's B and C, MatMul's B): their input positions.
std::vector<size_t> TrainableInputs(const Node& n);

// The operator for node `n` of `g`; weights[k] is the WeightRef of input k (value nullptr for
// inputs that are computed tensors). Throws kUnsupported naming the node for attributes outside
// what the backward pass implements.
std::unique_ptr<TailOp> MakeTailOp(const Graph& g, const Node& n, const std::vector<WeightRef>& weights);

}  // namespace msaflow::kernels
