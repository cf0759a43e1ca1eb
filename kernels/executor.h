// CNN executor on oneDNN: runs an imported (cut) ONNX graph over image batches and returns
// globally average-pooled features.
//
// Built for speed: convolutions take oneDNN's preferred (blocked) memory formats, elementwise
// chains and residual adds are fused as post-ops, scalar affine steps are folded into the
// convolution weights, intermediate buffers are reused by liveness, and one compiled plan is
// cached per input shape (any batch size, dynamic H/W). oneDNN threads over all cores.
//
// Precision: f32 (the default) computes as the model does. bf16 stores activations and weights
// as bfloat16 and accumulates in f32 (oneDNN's bf16 convolutions: twice the multiply-adds per
// instruction where the CPU has AVX512_BF16 or AMX); the features then differ from f32 by
// about 1 % relative, which the pipeline's accuracy must be measured to tolerate
// (docs/performance.md). It needs AVX-512 at least; elsewhere the constructor refuses it.
//
// int8 runs every convolution on signed/unsigned 8-bit activations and per-output-channel 8-bit
// weights with int32 sums (oneDNN's VNNI kernels), static quantization: each tensor's scale
// comes from its largest magnitude seen by Calibrate() (or SetRanges(), for ranges saved
// earlier) over representative images, run in f32. A convolution's output stays 8-bit when
// only convolutions read it (u8 after a ReLU or Clip at 0); everything else, and the feature
// layer, stays f32. It needs VNNI (AVX512_VNNI or AVX-VNNI); elsewhere the constructor refuses.
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
#include "kernels/precision.h"

namespace msaflow::kernels {

class Executor {
 public:
  // Throws kUnsupported (naming the node) for graphs outside what the executor runs, and for a
  // precision this CPU cannot run fast.
  explicit Executor(Graph graph, Precision precision = Precision::kF32);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // x: NCHW floats, n*c*h*w values. Returns n*FeatureDim() floats, row-major [n, C].
  // Throws kInvalidInput when the shape contradicts the model's fixed input dims.
  std::vector<float> Features(const float* x, int64_t n, int64_t c, int64_t h, int64_t w);

  // Channels of the cut tensor for an input of this shape (compiles the plan if needed).
  int64_t FeatureDim(int64_t c, int64_t h, int64_t w);

  // A graph of several cuts (ImportOnnxCuts): one pass over the images gives every cut's
  // features, in the import's order, each n x its FeatureDimsOfCuts() floats, row-major.
  // (Features() gives the first cut's alone.)
  std::vector<std::vector<float>> FeaturesOfCuts(const float* x, int64_t n, int64_t c, int64_t h, int64_t w);
  std::vector<int64_t> FeatureDimsOfCuts(int64_t c, int64_t h, int64_t w);
  // Per cut, whether the one pass computes it exactly as the model cut at it alone would: the
  // same fused operations on the same inputs. A cut that a deeper cut's fusion would leave
  // uncomputed is computed by a copy of its producer, and so as alone; not so where another
  // cut's branch reads a tensor on the way, which keeps an activation the cut alone would fuse
  // from being fused: that cut's features may then differ in the last bits.
  std::vector<bool> CutsAsAlone(int64_t c, int64_t h, int64_t w) const;

  // The cut tensors themselves, not pooled (a fine-tuning tail's inputs, kernels/tail.h): one
  // plain row-major f32 tensor per cut (the graph's output, then its more_outputs), each cut's
  // dims in *dims. Same precision rules as Features.
  std::vector<std::vector<float>> Maps(const float* x, int64_t n, int64_t c, int64_t h, int64_t w,
                                       std::vector<std::vector<int64_t>>* dims);
  // Both in one pass: the first cut's features (as Features gives them) and every further cut's
  // tensor plain (as Maps gives them, in *maps and *dims): a backbone's features and its
  // fine-tuning tail's inputs from one run of the trunk.
  std::vector<float> FeaturesAndMaps(const float* x, int64_t n, int64_t c, int64_t h, int64_t w,
                                     std::vector<std::vector<float>>* maps, std::vector<std::vector<int64_t>>* dims);

  // Checks, without compiling anything, that the graph runs on n images of c x h x w: shape
  // arithmetic folds, every shape fits its operator, the feature layer is NCHW or N x features.
  // Throws as Features would (kUnsupported / kInvalidInput naming the node).
  void CheckShape(int64_t n, int64_t c, int64_t h, int64_t w) const;

  // Number of fused operations after graph rewrites (for logs and tests).
  size_t FusedOpCount() const;

  // int8 calibration: the largest magnitude of every tensor (by name; the graph input too).
  // Calibrate() runs the graph in f32 over x and widens the ranges kept so far (call it once per
  // batch of representative images); SetRanges() installs ranges measured before. Either drops
  // the int8 plans compiled with the old ranges. Features() in int8 throws kInvalidInput until
  // there are ranges. Calibrate works in every precision (it is how ranges are measured).
  using Ranges = std::map<std::string, float>;
  void Calibrate(const float* x, int64_t n, int64_t c, int64_t h, int64_t w);
  const Ranges& ranges() const { return ranges_; }
  void SetRanges(Ranges ranges);

  struct Op;
  struct Plan;

 private:
  // kObserve: an f32 plan that records where each tensor can be read while it runs (Calibrate);
  // kMaps: the cut tensors copied out plain besides being pooled (Maps).
  enum class PlanKind { kFeatures, kObserve, kMaps };
  Plan& PlanFor(const std::array<int64_t, 4>& shape, PlanKind kind = PlanKind::kFeatures);

  std::vector<Op> ops_;
  size_t fused_op_count_ = 0;
  Graph graph_;
  Precision precision_;
  struct Engine;
  std::unique_ptr<Engine> engine_;
  std::map<std::array<int64_t, 4>, std::unique_ptr<Plan>> plans_, observe_plans_, maps_plans_;
  Ranges ranges_;
};

}  // namespace msaflow::kernels
