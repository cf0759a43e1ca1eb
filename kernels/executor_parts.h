// The executor's parts (internal to kernels/): what kernels/executor.cc's public methods are
// built from, in one file per job, all in namespace kernels::exec.
// - executor_ops.cc: an ONNX node's op (Conv, BatchNormalization folded, eltwise chains, pools,
//   Gemm, data movement), and BuildOps, which rewrites the graph and makes the ops;
// - executor_rewrites.cc: queries of the graph, its rewrites before ops are made (HardSwish, gated
//   activations, pads into convolutions) and the op list's (dead ops dropped, eltwise chains fused,
//   residual adds folded into convolutions);
// - executor_shapes.cc: one input shape's ops resolved: shape arithmetic folded, every tensor's
//   dims, identities dropped;
// - executor_emit.cc: a plan's oneDNN primitives and C++ steps emitted op by op (buffers, int8
//   types and scales), and Executor::PlanFor, which caches them per input shape.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernels/executor.h"
#include "kernels/fold.h"
#include "kernels/tensor_ops.h"

namespace msaflow::kernels::exec {

using dnnl::algorithm;
using dnnl::memory;
using Dims = std::vector<int64_t>;

struct EltStep {
  algorithm alg;
  float alpha = 0, beta = 0;
};

bool IsLinear(const EltStep& s);
// Appends `s` to `chain`, composing consecutive affine steps and dropping identities.
void PushStep(std::vector<EltStep>& chain, const EltStep& s);

// kPad, kReshape, kTranspose and kSlice move data on plain f32 tensors (kernels/tensor_ops.h);
// kFold is shape arithmetic that must fold when the plan is compiled (kernels/fold.h). kCast
// runs Cast on a computed tensor: to float16, the values rounded to float16 (round to nearest
// even) and kept as f32, which only a Cast back to float may read; to float, a copy.
// ONNX's TensorProto data types that Cast runs between.
constexpr int64_t kOnnxFloat = 1, kOnnxFloat16 = 10;

enum class Kind {
  kConv,
  kEltwise,
  kBinary,
  kPool,
  kGlobalPool,
  kConcat,
  kGemm,
  kPad,
  kReshape,
  kTranspose,
  kSlice,
  kCast,
  kFold
};

}  // namespace msaflow::kernels::exec

namespace msaflow::kernels {

struct Executor::Op {
  exec::Kind kind;
  std::string name;                 // ONNX node name, for errors
  std::vector<std::string> inputs;  // activations or constants; the data input first
  std::string output;
  Node node;  // as imported: folded from when its inputs are known
  // Conv; Gemm (weights [O, K])
  // Conv
  ConstTensor weights, bias;
  std::vector<int64_t> strides{1, 1}, dilations{1, 1}, pads{0, 0, 0, 0};  // pads: top, left, bottom, right
  std::string auto_pad = "NOTSET";
  int64_t group = 1;
  std::vector<exec::EltStep> post;      // eltwise chain after the op
  std::string sum_input;                // Conv: residual tensor added after `post`
  std::vector<exec::EltStep> post_sum;  // chain after the residual add
  // Binary
  dnnl::algorithm bin = dnnl::algorithm::binary_add;
  // Pool
  dnnl::algorithm pool = dnnl::algorithm::pooling_max;
  std::vector<int64_t> kernel;
  int64_t ceil_mode = 0;
  bool include_pad = false;
  int64_t keepdims = 1;  // GlobalPool from ReduceMean
  // Concat
  int64_t axis = 1;
  // Data movement, resolved per plan: Pad; Transpose; Slice (Split output `part`)
  PadSpec pad;
  std::vector<int64_t> perm;
  size_t part = 0;
  SliceSpec slice;
};

struct Executor::Engine {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream strm{eng};
};

struct Executor::Plan {
  struct Step {
    Step() = default;
    Step(dnnl::primitive p, std::unordered_map<int, dnnl::memory> a) : prim(std::move(p)), args(std::move(a)) {}
    dnnl::primitive prim;
    std::unordered_map<int, dnnl::memory> args;
    std::function<void()> fn;  // set: a C++ step on plain tensors, run after the stream drains
    void Run(dnnl::stream& strm) {
      if (fn) {
        strm.wait();
        fn();
      } else {
        prim.execute(strm, args);
      }
    }
  };
  std::vector<Step> steps;
  // Observe plans: tensor `name` is in `mem` once steps [0, after) have run.
  struct Observation {
    size_t after;
    std::string name;
    dnnl::memory mem;
  };
  std::vector<Observation> observations;
  dnnl::memory input;   // user NCHW, handle set per call
  dnnl::memory output;  // [N, C, 1, 1] plain
  int64_t channels = 0;
  struct Cut {  // a further cut of a several-cut graph (Graph::more_outputs), pooled as `output`
    dnnl::memory output;
    int64_t channels = 0;
  };
  std::vector<Cut> more;
  struct Map {  // a cut tensor, plain (kMaps plans)
    dnnl::memory mem;
    std::vector<int64_t> dims;
  };
  std::vector<Map> maps;
  std::vector<std::shared_ptr<void>> buffers;
};

}  // namespace msaflow::kernels

namespace msaflow::kernels::exec {

// Queries of the graph (executor_rewrites.cc).
const ConstTensor* ConstOf(const Graph& g, const std::string& name);
// The graph's cut tensors: its output, then the further cuts.
std::vector<std::string> Outputs(const Graph& g);
// Tensor -> the index of the node that computes it.
std::map<std::string, size_t> Producers(const Graph& g);
[[noreturn]] void Unsupported(const Node& n, const std::string& what);
bool ScalarInput(const Graph& g, const Node& n, size_t i, float* v);
bool ClipBounds(const Graph& g, const Node& n, float* lo, float* hi);

// The graph's rewrites (executor_rewrites.cc).
void RewriteHardSwish(Graph& g);
void RewriteGatedActivations(Graph& g);
void RewritePadIntoConv(Graph& g);

// The ops (executor_ops.cc): the graph rewritten, then one op per node, unfused, the ones no
// cut needs dropped.
std::vector<Executor::Op> BuildOps(Graph& g);

// The op list's rewrites (executor_rewrites.cc).
std::vector<Executor::Op> DropDeadOps(std::vector<Executor::Op> ops, const std::vector<std::string>& outs);
std::map<std::string, int> UseCounts(const std::vector<Executor::Op>& ops, const std::vector<std::string>& outs);
std::vector<Executor::Op> KeepLive(std::vector<Executor::Op> ops, const std::vector<char>& dead,
                                   std::map<size_t, std::vector<Executor::Op>> copies);
std::vector<Executor::Op> FuseEltwise(std::vector<Executor::Op> ops, const std::vector<std::string>& outs);
std::vector<Executor::Op> FoldResidualAdds(std::vector<Executor::Op> ops, const std::map<std::string, Dims>& shapes,
                                           const std::vector<std::string>& outs);

// One input shape's ops (executor_shapes.cc).
// One plan's ops with everything its input dims decide: shape arithmetic folded into constants,
// every tensor's dims, each op's padding made explicit (auto_pad, ceil_mode), axes made
// positive, the attributes-or-inputs of pads, reshapes and slices read, and the ops that turn
// out to be identities (zero pads, same-shape reshapes) dropped with their readers renamed.
struct Resolved {
  std::vector<Executor::Op> ops;
  std::map<std::string, Dims> shapes;         // the tensors the plan computes
  std::map<std::string, ConstTensor> folded;  // constants computed from shapes
  std::string output;                         // the cut tensor, after renames
  std::vector<std::string> more_outputs;      // the further cuts (Graph::more_outputs), after renames
  std::vector<std::string> outputs() const {
    std::vector<std::string> all{output};
    all.insert(all.end(), more_outputs.begin(), more_outputs.end());
    return all;
  }
};

std::string DimsText(const Dims& d);
Resolved Resolve(std::vector<Executor::Op> ops, const Graph& g, const Dims& in_dims);

}  // namespace msaflow::kernels::exec
