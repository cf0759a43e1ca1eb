// CNN executor on oneDNN: runs an imported (cut) ONNX graph over image batches and returns
// globally average-pooled features.
//
// Built for speed: convolutions take oneDNN's preferred (blocked) memory formats, elementwise
// chains and residual adds are fused as post-ops, scalar affine steps are folded into the
// convolution weights, intermediate buffers are reused by liveness, and one compiled plan is
// cached per input shape (any batch size, dynamic H/W). oneDNN threads over all cores.
//
// Thread-safety: an Executor is not thread-safe; use one per thread.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/onnx_graph.h"

namespace msaflow::kernels {

class Executor {
 public:
  // Throws kUnsupported (naming the node) for graphs outside what the executor runs.
  explicit Executor(Graph graph);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // x: NCHW floats, n*c*h*w values. Returns n*FeatureDim() floats, row-major [n, C].
  // Throws kInvalidInput when the shape contradicts the model's fixed input dims.
  std::vector<float> Features(const float* x, int64_t n, int64_t c, int64_t h, int64_t w);

  // Channels of the cut tensor for an input of this shape (compiles the plan if needed).
  int64_t FeatureDim(int64_t c, int64_t h, int64_t w);

  // Number of fused operations after graph rewrites (for logs and tests).
  size_t FusedOpCount() const;

  struct Op;
  struct Plan;

 private:
  Plan& PlanFor(const std::array<int64_t, 4>& shape);

  std::vector<Op> ops_;
  Graph graph_;
  struct Engine;
  std::unique_ptr<Engine> engine_;
  std::map<std::array<int64_t, 4>, std::unique_ptr<Plan>> plans_;
};

}  // namespace msaflow::kernels
