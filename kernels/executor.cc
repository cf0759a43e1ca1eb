#include "kernels/executor.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <oneapi/dnnl/dnnl.hpp>
#include <set>
#include <unordered_map>

#include "common/error.h"
#include "kernels/fold.h"
#include "kernels/tensor_ops.h"
#include "kernels/window.h"

namespace msaflow::kernels {

using dnnl::algorithm;
using dnnl::memory;
using Dims = std::vector<int64_t>;

namespace {

struct EltStep {
  algorithm alg;
  float alpha = 0, beta = 0;
};

bool IsLinear(const EltStep& s) { return s.alg == algorithm::eltwise_linear; }

// Appends `s` to `chain`, composing consecutive affine steps and dropping identities.
void PushStep(std::vector<EltStep>& chain, const EltStep& s) {
  if (IsLinear(s) && !chain.empty() && IsLinear(chain.back())) {
    EltStep& b = chain.back();  // y = a2 * (a1 x + b1) + b2
    b.beta = s.alpha * b.beta + s.beta;
    b.alpha = s.alpha * b.alpha;
  } else {
    chain.push_back(s);
  }
  if (IsLinear(chain.back()) && chain.back().alpha == 1.f && chain.back().beta == 0.f) chain.pop_back();
}

// kPad, kReshape, kTranspose and kSlice move data on plain f32 tensors (kernels/tensor_ops.h);
// kFold is shape arithmetic that must fold when the plan is compiled (kernels/fold.h).
enum class Kind { kConv, kEltwise, kBinary, kPool, kGlobalPool, kConcat, kGemm, kPad, kReshape, kTranspose, kSlice, kFold };

}  // namespace

struct Executor::Op {
  Kind kind;
  std::string name;                 // ONNX node name, for errors
  std::vector<std::string> inputs;  // activations or constants; the data input first
  std::string output;
  Node node;                        // as imported: folded from when its inputs are known
  // Conv; Gemm (weights [O, K])
  // Conv
  ConstTensor weights, bias;
  Dims strides{1, 1}, dilations{1, 1}, pads{0, 0, 0, 0};  // pads: top, left, bottom, right
  std::string auto_pad = "NOTSET";
  int64_t group = 1;
  std::vector<EltStep> post;     // eltwise chain after the op
  std::string sum_input;         // Conv: residual tensor added after `post`
  std::vector<EltStep> post_sum; // chain after the residual add
  // Binary
  algorithm bin = algorithm::binary_add;
  // Pool
  algorithm pool = algorithm::pooling_max;
  Dims kernel;
  int64_t ceil_mode = 0;
  bool include_pad = false;
  int64_t keepdims = 1;  // GlobalPool from ReduceMean
  // Concat
  int64_t axis = 1;
  // Data movement, resolved per plan: Pad; Transpose; Slice (Split output `part`)
  PadSpec pad;
  Dims perm;
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
    Step(dnnl::primitive p, std::unordered_map<int, memory> a) : prim(std::move(p)), args(std::move(a)) {}
    dnnl::primitive prim;
    std::unordered_map<int, memory> args;
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
    memory mem;
  };
  std::vector<Observation> observations;
  memory input;   // user NCHW, handle set per call
  memory output;  // [N, C, 1, 1] plain
  int64_t channels = 0;
  struct Cut {  // a further cut of a several-cut graph (Graph::more_outputs), pooled as `output`
    memory output;
    int64_t channels = 0;
  };
  std::vector<Cut> more;
  struct Map {  // a cut tensor, plain (kMaps plans)
    memory mem;
    Dims dims;
  };
  std::vector<Map> maps;
  std::vector<std::shared_ptr<void>> buffers;
};

namespace {

const ConstTensor* ConstOf(const Graph& g, const std::string& name) {
  auto it = g.consts.find(name);
  return it == g.consts.end() ? nullptr : &it->second;
}

[[noreturn]] void Unsupported(const Node& n, const std::string& what) {
  Throw(ErrorKind::kUnsupported, "node '" + n.name + "' (" + n.op + "): " + what);
}

// Scalar constant value of input `i`, if it is one.
bool ScalarInput(const Graph& g, const Node& n, size_t i, float* v) {
  if (i >= n.inputs.size()) return false;
  const ConstTensor* c = ConstOf(g, n.inputs[i]);
  if (!c || c->numel() != 1) return false;
  *v = c->data[0];
  return true;
}

bool ClipBounds(const Graph& g, const Node& n, float* lo, float* hi) {
  *lo = n.Float("min", -std::numeric_limits<float>::max());
  *hi = n.Float("max", std::numeric_limits<float>::max());
  if (n.inputs.size() > 1 && !n.inputs[1].empty() && !ScalarInput(g, n, 1, lo)) return false;
  if (n.inputs.size() > 2 && !n.inputs[2].empty() && !ScalarInput(g, n, 2, hi)) return false;
  return true;
}

// Every cut tensor of the graph: its output, then the more outputs of a several-cut import.
std::vector<std::string> Outputs(const Graph& g) {
  std::vector<std::string> all{g.output};
  all.insert(all.end(), g.more_outputs.begin(), g.more_outputs.end());
  return all;
}

// The index of the node producing each tensor.
std::map<std::string, size_t> Producers(const Graph& g) {
  std::map<std::string, size_t> producer;
  for (size_t i = 0; i < g.nodes.size(); ++i)
    for (const auto& o : g.nodes[i].outputs) producer[o] = i;
  return producer;
}

// Rewrites x * clip(x + 3, 0, 6) (the decomposed hardswish that exporters emit) into one
// HardSwish followed by a scale of 6, which the following "/ 6" cancels.
void RewriteHardSwish(Graph& g) {
  const std::map<std::string, size_t> producer = Producers(g);
  for (auto& n : g.nodes) {
    if (n.op != "Mul" || n.inputs.size() != 2) continue;
    for (int side = 0; side < 2; ++side) {
      const std::string& x = n.inputs[side];
      auto pc = producer.find(n.inputs[1 - side]);
      if (pc == producer.end()) continue;
      const Node& clip = g.nodes[pc->second];
      float lo, hi;
      if (clip.op != "Clip" || !ClipBounds(g, clip, &lo, &hi) || lo != 0.f || hi != 6.f) continue;
      auto pa = producer.find(clip.inputs[0]);
      if (pa == producer.end()) continue;
      const Node& add = g.nodes[pa->second];
      if (add.op != "Add" || add.inputs.size() != 2) continue;
      float three = 0;
      bool ok = (add.inputs[0] == x && ScalarInput(g, add, 1, &three)) ||
                (add.inputs[1] == x && ScalarInput(g, add, 0, &three));
      if (!ok || three != 3.f) continue;
      n.op = "msaflow.HardSwishX6";
      n.inputs = {x};
      break;
    }
  }
}

// x * Sigmoid(x) (SiLU, as exporters write it) becomes one swish; x * HardSigmoid(x; 1/6, 1/2)
// becomes one HardSwish (torch.onnx's hardswish below opset 14).
void RewriteGatedActivations(Graph& g) {
  const std::map<std::string, size_t> producer = Producers(g);
  for (auto& n : g.nodes) {
    if (n.op != "Mul" || n.inputs.size() != 2) continue;
    for (int side = 0; side < 2; ++side) {
      auto p = producer.find(n.inputs[1 - side]);
      if (p == producer.end()) continue;
      const Node& gate = g.nodes[p->second];
      if (gate.inputs.empty() || gate.inputs[0] != n.inputs[side]) continue;
      const bool swish = gate.op == "Sigmoid";
      const bool hardswish = gate.op == "HardSigmoid" && std::fabs(gate.Float("alpha", 0.2f) - 1.f / 6.f) < 1e-7f &&
                             gate.Float("beta", 0.5f) == 0.5f;
      if (!swish && !hardswish) continue;
      n.op = swish ? "msaflow.Swish" : "HardSwish";
      n.inputs = {n.inputs[side]};
      break;
    }
  }
}

// A constant-zero Pad of the spatial axes whose one reader is a convolution (as converters from
// TensorFlow write "SAME" padding) becomes that convolution's own padding.
void RewritePadIntoConv(Graph& g) {
  std::map<std::string, int> readers;
  for (const auto& n : g.nodes)
    for (const auto& in : n.inputs) readers[in]++;
  readers[g.output]++;
  for (const auto& o : g.more_outputs) readers[o]++;
  const std::map<std::string, size_t> producer = Producers(g);
  for (auto& conv : g.nodes) {
    if (conv.op != "Conv" || conv.inputs.empty() || conv.Str("auto_pad", "NOTSET") != "NOTSET") continue;
    auto p = producer.find(conv.inputs[0]);
    if (p == producer.end() || readers[conv.inputs[0]] != 1) continue;
    const Node& pad = g.nodes[p->second];
    if (pad.op != "Pad" || pad.Str("mode", "constant") != "constant") continue;
    PadSpec spec;
    try {
      spec = ResolvePad(pad, [&](const std::string& t) { return ConstOf(g, t); }, 4);
    } catch (const Error&) {
      continue;  // pads computed at run time, or malformed: the Pad runs (or fails) on its own
    }
    const Dims& q = spec.pads;  // N, C, H, W begins, then ends
    if (spec.value != 0.f || q[0] || q[1] || q[4] || q[5]) continue;
    if (std::any_of(q.begin(), q.end(), [](int64_t v) { return v < 0; })) continue;
    Dims cp = conv.Has("pads") ? conv.Ints("pads") : Dims{0, 0, 0, 0};
    if (cp.size() != 4) continue;
    conv.attrs["pads"].ints = {cp[0] + q[2], cp[1] + q[3], cp[2] + q[6], cp[3] + q[7]};
    conv.inputs[0] = pad.inputs[0];
  }
}

// A window's kernel, strides and dilations at least 1, pads at least 0, all of them at most
// 65536 (so that no size arithmetic on them overflows or divides by zero).
void CheckWindow(const Node& n, const Dims& kernel, const Dims& strides, const Dims& dilations, const Dims& pads) {
  auto in = [](const Dims& v, int64_t lo) {
    return std::all_of(v.begin(), v.end(), [lo](int64_t x) { return x >= lo && x <= 65536; });
  };
  if (!in(kernel, 1) || !in(strides, 1) || !in(dilations, 1) || !in(pads, 0))
    Unsupported(n, "kernel, strides and dilations must be 1..65536 and pads 0..65536");
}

Executor::Op MakeConv(const Graph& g, const Node& n) {
  Executor::Op op;
  op.kind = Kind::kConv;
  op.name = n.name;
  if (n.inputs.size() < 2) Unsupported(n, "expected inputs X, W[, B]");
  const ConstTensor* w = ConstOf(g, n.inputs[1]);
  if (!w) Unsupported(n, "weights must be a constant");
  if (w->dims.size() != 4) Unsupported(n, "only 2-D convolutions (4-D weights) are supported");
  op.weights = *w;
  if (n.inputs.size() > 2 && !n.inputs[2].empty()) {
    const ConstTensor* b = ConstOf(g, n.inputs[2]);
    if (!b) Unsupported(n, "bias must be a constant");
    op.bias = *b;
  } else {
    op.bias.dims = {w->dims[0]};
    op.bias.data.assign(static_cast<size_t>(w->dims[0]), 0.f);
  }
  op.inputs = {n.inputs[0]};
  op.group = n.Int("group", 1);
  if (n.Has("strides")) op.strides = n.Ints("strides");
  if (n.Has("dilations")) op.dilations = n.Ints("dilations");
  if (n.Has("pads")) {
    auto p = n.Ints("pads");  // x1_begin, x2_begin, x1_end, x2_end
    if (p.size() != 4) Unsupported(n, "expected 4 pads");
    op.pads = p;
  }
  op.auto_pad = n.Str("auto_pad", "NOTSET");
  if (op.strides.size() != 2 || op.dilations.size() != 2) Unsupported(n, "expected 2-D strides and dilations");
  if (op.group < 1 || w->dims[0] % op.group != 0) Unsupported(n, "invalid group count");
  CheckWindow(n, {w->dims[2], w->dims[3]}, op.strides, op.dilations, op.pads);
  return op;
}

Executor::Op MakeEltwise(const Node& n, const std::string& in, const std::vector<EltStep>& steps) {
  Executor::Op op;
  op.kind = Kind::kEltwise;
  op.name = n.name;
  op.inputs = {in};
  for (const auto& s : steps) PushStep(op.post, s);
  return op;
}

// Standalone batch norm = depthwise 1x1 convolution.
Executor::Op MakeBatchNorm(const Graph& g, const Node& n) {
  Executor::Op op;
  if (n.inputs.size() != 5) Unsupported(n, "expected inputs X, scale, B, mean, var");
  const ConstTensor *s = ConstOf(g, n.inputs[1]), *b = ConstOf(g, n.inputs[2]), *m = ConstOf(g, n.inputs[3]),
                    *v = ConstOf(g, n.inputs[4]);
  if (!s || !b || !m || !v) Unsupported(n, "scale, bias, mean and variance must be constants");
  int64_t c = s->numel();
  if (b->numel() != c || m->numel() != c || v->numel() != c) Unsupported(n, "parameter sizes differ");
  float eps = n.Float("epsilon", 1e-5f);
  op.kind = Kind::kConv;
  op.name = n.name;
  op.inputs = {n.inputs[0]};
  op.group = c;
  op.weights.dims = {c, 1, 1, 1};
  op.bias.dims = {c};
  for (int64_t i = 0; i < c; ++i) {
    size_t k = static_cast<size_t>(i);
    float sc = s->data[k] / std::sqrt(v->data[k] + eps);
    op.weights.data.push_back(sc);
    op.bias.data.push_back(b->data[k] - m->data[k] * sc);
  }
  return op;
}

// Add, Sub, Mul, Div: an affine eltwise step when one input is a scalar constant, else a
// binary op (the second input broadcast to the first).
Executor::Op MakeArithmetic(const Graph& g, const Node& n) {
  const std::string& op_type = n.op;
  if (n.inputs.size() != 2) Unsupported(n, "expected two inputs");
  float c;
  bool c1 = ScalarInput(g, n, 1, &c), c0 = !c1 && ScalarInput(g, n, 0, &c);
  if (c0 || c1) {
    const std::string& x = n.inputs[c1 ? 0 : 1];
    EltStep s{algorithm::eltwise_linear, 1.f, 0.f};
    if (op_type == "Add") s.beta = c;
    if (op_type == "Mul") s.alpha = c;
    if (op_type == "Sub") c1 ? (s.beta = -c) : (s.alpha = -1.f, s.beta = c);
    if (op_type == "Div" && c0) return MakeEltwise(n, x, {{algorithm::eltwise_pow, c, -1.f}});  // c * x^-1
    if (op_type == "Div") s.alpha = 1.f / c;
    return MakeEltwise(n, x, {s});
  }
  Executor::Op op;
  op.kind = Kind::kBinary;
  op.name = n.name;
  op.inputs = n.inputs;
  op.bin = op_type == "Add"   ? algorithm::binary_add
           : op_type == "Sub" ? algorithm::binary_sub
           : op_type == "Mul" ? algorithm::binary_mul
                              : algorithm::binary_div;
  return op;
}

Executor::Op MakePool(const Node& n) {
  Executor::Op op;
  op.name = n.name;
  op.inputs = {n.inputs[0]};
  if (n.op == "GlobalAveragePool") {
    op.kind = Kind::kGlobalPool;
    op.pool = algorithm::pooling_avg_exclude_padding;
    return op;
  }
  op.kind = Kind::kPool;
  op.kernel = n.Ints("kernel_shape");
  if (op.kernel.size() != 2) Unsupported(n, "expected a 2-D kernel_shape");
  if (n.Has("strides")) op.strides = n.Ints("strides");
  if (n.Has("pads")) op.pads = n.Ints("pads");
  if (n.Has("dilations") && n.Ints("dilations") != Dims{1, 1}) Unsupported(n, "dilated pooling");
  op.auto_pad = n.Str("auto_pad", "NOTSET");
  if (op.strides.size() != 2 || op.pads.size() != 4) Unsupported(n, "expected 2-D strides and 4 pads");
  CheckWindow(n, op.kernel, op.strides, {1, 1}, op.pads);
  op.ceil_mode = n.Int("ceil_mode", 0);
  if (n.outputs.size() > 1 && !n.outputs[1].empty()) Unsupported(n, "MaxPool indices output is not supported");
  op.include_pad = n.op == "AveragePool" && n.Int("count_include_pad", 0) != 0;
  op.pool = n.op == "MaxPool"  ? algorithm::pooling_max
            : op.include_pad ? algorithm::pooling_avg_include_padding
                             : algorithm::pooling_avg_exclude_padding;
  return op;
}

Executor::Op MakeConcat(const Graph& g, const Node& n) {
  Executor::Op op;
  op.kind = Kind::kConcat;
  op.name = n.name;
  op.inputs = n.inputs;
  op.axis = n.Int("axis", 1);
  (void)g;  // constant inputs: shape arithmetic, folded per plan; refused there on image tensors
  return op;
}

// ReduceMean over the two spatial axes of an NCHW tensor: global average pooling.
Executor::Op MakeReduceMean(const Graph& g, const Node& n) {
  bool present;
  std::vector<int64_t> axes =
      IntsArg(n, 1, "axes", [&](const std::string& t) { return ConstOf(g, t); }, &present);
  std::sort(axes.begin(), axes.end());
  if (axes != std::vector<int64_t>{2, 3} && axes != std::vector<int64_t>{-2, -1})
    Unsupported(n, "only the mean over the spatial axes (2, 3) of an NCHW tensor is supported");
  Executor::Op op;
  op.kind = Kind::kGlobalPool;
  op.name = n.name;
  op.inputs = {n.inputs[0]};
  op.pool = algorithm::pooling_avg_exclude_padding;
  op.keepdims = n.Int("keepdims", 1);
  return op;
}

// Gemm (Y = alpha A B' + beta C, B and C constants) and MatMul by a constant matrix: an inner
// product over [N, K] with weights [O, K].
Executor::Op MakeGemm(const Graph& g, const Node& n) {
  Executor::Op op;
  op.kind = Kind::kGemm;
  op.name = n.name;
  if (n.inputs.size() < 2) Unsupported(n, "expected inputs A, B");
  const ConstTensor* b = ConstOf(g, n.inputs[1]);
  if (!b || b->dims.size() != 2) Unsupported(n, "B must be a constant matrix");
  if (n.Int("transA", 0) != 0) Unsupported(n, "transA=1 is not supported");
  const bool trans_b = n.op == "Gemm" && n.Int("transB", 0) != 0;
  const float alpha = n.op == "Gemm" ? n.Float("alpha", 1.f) : 1.f, beta = n.op == "Gemm" ? n.Float("beta", 1.f) : 1.f;
  const int64_t k = trans_b ? b->dims[1] : b->dims[0], o = trans_b ? b->dims[0] : b->dims[1];
  op.weights.dims = {o, k};
  op.weights.data.resize(static_cast<size_t>(o * k));
  for (int64_t r = 0; r < o; ++r)
    for (int64_t c = 0; c < k; ++c)
      op.weights.data[static_cast<size_t>(r * k + c)] =
          alpha * b->data[static_cast<size_t>(trans_b ? r * k + c : c * o + r)];
  op.bias.dims = {o};
  op.bias.data.assign(static_cast<size_t>(o), 0.f);
  if (n.inputs.size() > 2 && !n.inputs[2].empty()) {
    const ConstTensor* c = ConstOf(g, n.inputs[2]);
    if (!c) Unsupported(n, "C must be a constant");
    if (c->numel() != 1 && c->numel() != o) Unsupported(n, "C must be a scalar or one value per output");
    for (int64_t r = 0; r < o; ++r) op.bias.data[static_cast<size_t>(r)] = beta * c->data[c->numel() == 1 ? 0 : static_cast<size_t>(r)];
  }
  op.inputs = {n.inputs[0]};
  return op;
}

// Operators whose data input comes first and whose other inputs (shapes, pads, axes) are read
// when the plan is compiled.
Executor::Op MakeDataMove(const Node& n, Kind kind) {
  Executor::Op op;
  op.kind = kind;
  op.name = n.name;
  for (const auto& in : n.inputs)
    if (!in.empty()) op.inputs.push_back(in);
  if (op.inputs.empty() || op.inputs[0] != n.inputs[0]) Unsupported(n, "the data input is missing");
  if (kind == Kind::kTranspose) op.perm = n.Ints("perm");
  return op;
}

// The op for one ONNX node (Identity and Dropout are aliases, handled by BuildOps). Throws
// kUnsupported naming the node for an operator or a form the executor does not run.
Executor::Op MakeOp(const Graph& g, const Node& n) {
  const std::string& t = n.op;
  if (n.inputs.empty() || n.inputs[0].empty()) Unsupported(n, "the node has no input");
  if (n.outputs.empty() || n.outputs[0].empty()) Unsupported(n, "the node has no output");
  if (t == "Conv") return MakeConv(g, n);
  if (t == "BatchNormalization") return MakeBatchNorm(g, n);
  if (t == "Relu") return MakeEltwise(n, n.inputs[0], {{algorithm::eltwise_relu, 0.f, 0.f}});
  if (t == "Clip") {
    float lo, hi;
    if (!ClipBounds(g, n, &lo, &hi)) Unsupported(n, "min and max must be scalar constants");
    return MakeEltwise(n, n.inputs[0], {{algorithm::eltwise_clip, lo, hi}});
  }
  if (t == "HardSigmoid")
    return MakeEltwise(n, n.inputs[0],
                       {{algorithm::eltwise_linear, n.Float("alpha", 0.2f), n.Float("beta", 0.5f)},
                        {algorithm::eltwise_clip, 0.f, 1.f}});
  if (t == "HardSwish") return MakeEltwise(n, n.inputs[0], {{algorithm::eltwise_hardswish, 0.f, 0.f}});
  if (t == "msaflow.HardSwishX6")
    return MakeEltwise(n, n.inputs[0], {{algorithm::eltwise_hardswish, 0.f, 0.f}, {algorithm::eltwise_linear, 6.f, 0.f}});
  if (t == "Sigmoid") return MakeEltwise(n, n.inputs[0], {{algorithm::eltwise_logistic, 0.f, 0.f}});
  if (t == "Add" || t == "Sub" || t == "Mul" || t == "Div") return MakeArithmetic(g, n);
  if (t == "msaflow.Swish") return MakeEltwise(n, n.inputs[0], {{algorithm::eltwise_swish, 1.f, 0.f}});
  if (t == "GlobalAveragePool" || t == "AveragePool" || t == "MaxPool") return MakePool(n);
  if (t == "ReduceMean") return MakeReduceMean(g, n);
  if (t == "Concat") return MakeConcat(g, n);
  if (t == "Gemm" || t == "MatMul") return MakeGemm(g, n);
  if (t == "Pad") return MakeDataMove(n, Kind::kPad);
  if (t == "Reshape" || t == "Flatten" || t == "Squeeze" || t == "Unsqueeze") return MakeDataMove(n, Kind::kReshape);
  if (t == "Transpose") return MakeDataMove(n, Kind::kTranspose);
  if (t == "Slice" || t == "Split") return MakeDataMove(n, Kind::kSlice);
  if (t == "Shape" || t == "Gather" || t == "Cast" || t == "ConstantOfShape") return MakeDataMove(n, Kind::kFold);
  Unsupported(n, "operator is not supported by the msaflow executor");
}

// Drops ops nothing reads any more (e.g. the pieces of a rewritten hardswish).
std::vector<Executor::Op> DropDeadOps(std::vector<Executor::Op> ops, const std::vector<std::string>& outs) {
  std::set<std::string> live(outs.begin(), outs.end());
  std::vector<char> keep(ops.size(), 0);
  for (size_t i = ops.size(); i-- > 0;) {
    if (!live.count(ops[i].output)) continue;
    keep[i] = 1;
    for (const auto& in : ops[i].inputs) live.insert(in);
    if (!ops[i].sum_input.empty()) live.insert(ops[i].sum_input);  // a fused residual
  }
  std::vector<Executor::Op> kept;
  for (size_t i = 0; i < ops.size(); ++i)
    if (keep[i]) kept.push_back(std::move(ops[i]));
  return kept;
}

std::vector<Executor::Op> BuildOps(Graph& g) {
  RewriteHardSwish(g);
  RewriteGatedActivations(g);
  RewritePadIntoConv(g);
  std::vector<Executor::Op> ops;
  std::map<std::string, std::string> alias;  // Identity/Dropout outputs
  auto resolve = [&](const std::string& t) {
    auto it = alias.find(t);
    return it == alias.end() ? t : it->second;
  };
  for (Node n : g.nodes) {
    for (auto& in : n.inputs) in = resolve(in);
    if (n.op == "Identity" || n.op == "Dropout") {
      if (n.inputs.empty() || n.outputs.empty()) Unsupported(n, "the node has no input or no output");
      alias[n.outputs[0]] = n.inputs[0];
      continue;
    }
    Executor::Op op = MakeOp(g, n);
    op.node = n;
    if (n.op == "Split") {  // one slice per output
      for (size_t k = 0; k < n.outputs.size(); ++k) {
        if (n.outputs[k].empty()) continue;
        Executor::Op part = op;
        part.part = k;
        part.output = n.outputs[k];
        ops.push_back(std::move(part));
      }
      continue;
    }
    op.output = n.outputs.at(0);
    ops.push_back(std::move(op));
  }
  g.output = resolve(g.output);
  for (auto& o : g.more_outputs) o = resolve(o);
  return DropDeadOps(std::move(ops), Outputs(g));
}

// Consumers of each tensor; each tensor of `outs` counts as one more.
std::map<std::string, int> UseCounts(const std::vector<Executor::Op>& ops, const std::vector<std::string>& outs) {
  std::map<std::string, int> uses;
  for (const auto& op : ops) {
    for (const auto& in : op.inputs) uses[in]++;
    if (!op.sum_input.empty()) uses[op.sum_input]++;
  }
  for (const auto& o : outs) uses[o]++;
  return uses;
}

// The ops not merged into another, each followed by the copies made of it.
std::vector<Executor::Op> KeepLive(std::vector<Executor::Op> ops, const std::vector<char>& dead,
                                   std::map<size_t, std::vector<Executor::Op>> copies) {
  std::vector<Executor::Op> kept;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (!dead[i]) kept.push_back(std::move(ops[i]));
    for (auto& copy : copies[i]) kept.push_back(std::move(copy));
  }
  return kept;
}

// Merges single-consumer elementwise ops into their producer (Conv or Eltwise). A cut tensor
// (`outs`) that the merge would leave uncomputed is computed by a copy of its producer as it was
// (the model cut there alone computes it just so), run right after it.
std::vector<Executor::Op> FuseEltwise(std::vector<Executor::Op> ops, const std::vector<std::string>& outs) {
  auto uses = UseCounts(ops, {});
  const std::set<std::string> cuts(outs.begin(), outs.end());
  std::map<size_t, std::vector<Executor::Op>> copies;  // by the op they follow
  std::map<std::string, size_t> producer;
  std::vector<char> dead(ops.size(), 0);
  for (size_t i = 0; i < ops.size(); ++i) {
    Executor::Op& op = ops[i];
    if (op.kind == Kind::kEltwise) {
      auto p = producer.find(op.inputs[0]);
      if (p != producer.end() && uses[op.inputs[0]] == 1) {
        Executor::Op& prev = ops[p->second];
        if (prev.kind == Kind::kConv || prev.kind == Kind::kEltwise || prev.kind == Kind::kGemm) {
          if (cuts.count(prev.output)) copies[p->second].push_back(prev);
          auto& chain = prev.sum_input.empty() ? prev.post : prev.post_sum;
          for (const auto& s : op.post) PushStep(chain, s);
          prev.output = op.output;
          producer[op.output] = p->second;
          dead[i] = 1;
          continue;
        }
      }
    }
    producer[op.output] = i;
  }
  return KeepLive(std::move(ops), dead, std::move(copies));
}

memory::dims ToDims(const Dims& d) { return memory::dims(d.begin(), d.end()); }

// The convolution's elementwise chain and residual add. dst_scale (int8 outputs): the chain runs
// on real values, the residual is stored in the output's units (times dst_scale back to real),
// and a last step divides by dst_scale before oneDNN rounds to 8 bits.
dnnl::post_ops MakePostOps(const Executor::Op& op, float dst_scale = 1.f) {
  dnnl::post_ops po;
  std::vector<EltStep> post = op.post, post_sum = op.post_sum;
  if (dst_scale != 1.f) PushStep(op.sum_input.empty() ? post : post_sum, {algorithm::eltwise_linear, 1.f / dst_scale, 0.f});
  for (const auto& s : post) po.append_eltwise(1.f, s.alg, s.alpha, s.beta);
  if (!op.sum_input.empty()) {
    po.append_sum(dst_scale);
    for (const auto& s : post_sum) po.append_eltwise(1.f, s.alg, s.alpha, s.beta);
  }
  return po;
}

}  // namespace

Precision ParsePrecision(const std::string& name) {
  if (name == "f32") return Precision::kF32;
  if (name == "bf16") return Precision::kBF16;
  if (name == "int8") return Precision::kInt8;
  Throw(ErrorKind::kInvalidInput, "precision '" + name + "': expected \"f32\", \"bf16\" or \"int8\"");
}

const char* PrecisionName(Precision p) {
  return p == Precision::kBF16 ? "bf16" : p == Precision::kInt8 ? "int8" : "f32";
}

bool PrecisionAvailable(Precision p, std::string* why) {
  if (p == Precision::kF32) return true;
  using isa = dnnl::cpu_isa;
  const isa have = dnnl::get_effective_cpu_isa();
  auto one_of = [have](std::initializer_list<isa> fast) { return std::find(fast.begin(), fast.end(), have) != fast.end(); };
  if (p == Precision::kInt8) {
    // Without VNNI oneDNN multiplies u8 by s8 in pairs summed into int16 (vpmaddubsw), which
    // saturates for large weights: results would be silently wrong, not just slow.
    if (one_of({isa::avx2_vnni, isa::avx512_core_vnni, isa::avx512_core_bf16, isa::avx512_core_amx})) return true;
    if (why) *why = "int8 needs a CPU with VNNI (AVX512_VNNI or AVX-VNNI); without it oneDNN's int8 sums can saturate";
    return false;
  }
  // oneDNN runs bf16 convolutions natively from AVX512_BF16 on and emulates them on AVX-512
  // cores; below that it has only reference kernels, hundreds of times slower.
  if (one_of({isa::avx512_core, isa::avx512_core_vnni, isa::avx512_core_bf16, isa::avx512_core_amx})) return true;
  if (why) *why = "bf16 needs a CPU with AVX-512 (oneDNN has only reference kernels below it)";
  return false;
}

Executor::Executor(Graph graph, Precision precision)
    : graph_(std::move(graph)), precision_(precision), engine_(std::make_unique<Engine>()) {
  std::string why;
  if (!PrecisionAvailable(precision, &why)) Throw(ErrorKind::kUnsupported, std::string("executor: ") + why);
  // Unfused: shape arithmetic written as elementwise ops must fold node by node per plan.
  ops_ = BuildOps(graph_);
  fused_op_count_ = FuseEltwise(ops_, Outputs(graph_)).size();
}

Executor::~Executor() = default;

size_t Executor::FusedOpCount() const { return fused_op_count_; }

int64_t Executor::FeatureDim(int64_t c, int64_t h, int64_t w) {
  const int64_t n = graph_.input_dims.empty() || graph_.input_dims[0] <= 0 ? 1 : graph_.input_dims[0];
  return PlanFor({n, c, h, w}).channels;
}

void Executor::SetRanges(Ranges ranges) {
  ranges_ = std::move(ranges);
  if (precision_ == Precision::kInt8) plans_.clear();
}

void Executor::Calibrate(const float* x, int64_t n, int64_t c, int64_t h, int64_t w) {
  Plan& plan = PlanFor({n, c, h, w}, PlanKind::kObserve);
  auto widen = [this](const std::string& name, const float* v, size_t count) {
    float m = 0;
    for (size_t i = 0; i < count; ++i) m = std::max(m, std::fabs(v[i]));
    if (!std::isfinite(m)) Throw(ErrorKind::kInvalidInput, "executor: calibration: tensor '" + name + "' is not finite");
    float& r = ranges_[name];
    r = std::max(r, m);
  };
  widen(graph_.input, x, static_cast<size_t>(n * c * h * w));
  plan.input.set_data_handle(const_cast<float*>(x));
  size_t next = 0;
  for (size_t i = 0; i < plan.steps.size(); ++i) {
    plan.steps[i].Run(engine_->strm);
    for (; next < plan.observations.size() && plan.observations[next].after == i + 1; ++next) {
      engine_->strm.wait();
      const memory& m = plan.observations[next].mem;  // f32; blocked layouts pad with zeros
      widen(plan.observations[next].name, static_cast<const float*>(m.get_data_handle()),
            m.get_desc().get_size() / sizeof(float));
    }
  }
  engine_->strm.wait();
  if (precision_ == Precision::kInt8) plans_.clear();
}

std::vector<float> Executor::Features(const float* x, int64_t n, int64_t c, int64_t h, int64_t w) {
  if (precision_ == Precision::kInt8 && ranges_.empty())
    Throw(ErrorKind::kInvalidInput, "executor: int8 needs calibration ranges first (Calibrate or SetRanges)");
  Plan& plan = PlanFor({n, c, h, w});
  plan.input.set_data_handle(const_cast<float*>(x));
  for (auto& s : plan.steps) s.Run(engine_->strm);
  engine_->strm.wait();
  std::vector<float> out(static_cast<size_t>(n * plan.channels));
  std::memcpy(out.data(), plan.output.get_data_handle(), out.size() * sizeof(float));
  return out;
}

std::vector<std::vector<float>> Executor::Maps(const float* x, int64_t n, int64_t c, int64_t h, int64_t w,
                                               std::vector<std::vector<int64_t>>* dims) {
  if (precision_ == Precision::kInt8 && ranges_.empty())
    Throw(ErrorKind::kInvalidInput, "executor: int8 needs calibration ranges first (Calibrate or SetRanges)");
  Plan& plan = PlanFor({n, c, h, w}, PlanKind::kMaps);
  plan.input.set_data_handle(const_cast<float*>(x));
  for (auto& s : plan.steps) s.Run(engine_->strm);
  engine_->strm.wait();
  std::vector<std::vector<float>> out;
  dims->clear();
  out.reserve(plan.maps.size());
  dims->reserve(plan.maps.size());
  for (const Plan::Map& m : plan.maps) {
    const auto* p = static_cast<const float*>(m.mem.get_data_handle());
    out.emplace_back(p, p + NumElements(m.dims));
    dims->push_back(m.dims);
  }
  return out;
}

std::vector<std::vector<float>> Executor::FeaturesOfCuts(const float* x, int64_t n, int64_t c, int64_t h, int64_t w) {
  std::vector<std::vector<float>> all;
  all.push_back(Features(x, n, c, h, w));  // runs the plan: every cut is pooled
  for (const Plan::Cut& more : PlanFor({n, c, h, w}).more) {
    all.emplace_back(static_cast<size_t>(n * more.channels));
    std::memcpy(all.back().data(), more.output.get_data_handle(), all.back().size() * sizeof(float));
  }
  return all;
}

std::vector<int64_t> Executor::FeatureDimsOfCuts(int64_t c, int64_t h, int64_t w) {
  const int64_t n = graph_.input_dims.empty() || graph_.input_dims[0] <= 0 ? 1 : graph_.input_dims[0];
  const Plan& plan = PlanFor({n, c, h, w});
  std::vector<int64_t> dims{plan.channels};
  for (const Plan::Cut& more : plan.more) dims.push_back(more.channels);
  return dims;
}

namespace {

// One plan's ops with everything its input dims decide: shape arithmetic folded into constants,
// every tensor's dims, each op's padding made explicit (auto_pad, ceil_mode), axes made
// positive, the attributes-or-inputs of pads, reshapes and slices read, and the ops that turn
// out to be identities (zero pads, same-shape reshapes) dropped with their readers renamed.
struct Resolved {
  std::vector<Executor::Op> ops;
  std::map<std::string, Dims> shapes;           // the tensors the plan computes
  std::map<std::string, ConstTensor> folded;    // constants computed from shapes
  std::string output;                           // the cut tensor, after renames
  std::vector<std::string> more_outputs;        // the further cuts (Graph::more_outputs), after renames
  std::vector<std::string> outputs() const {
    std::vector<std::string> all{output};
    all.insert(all.end(), more_outputs.begin(), more_outputs.end());
    return all;
  }
};

std::string DimsText(const Dims& d) {
  std::string t;
  for (int64_t v : d) t += (t.empty() ? "" : "x") + std::to_string(v);
  return t.empty() ? "scalar" : t;
}

// Pad, Reshape, Transpose and Slice: their specs read (pads, target shape, perm, starts) and
// their output dims.
Dims DataMoveDims(Executor::Op& op, const Dims& x, const KnownFn& known, bool* is_identity) {
  const Node& n = op.node;
  auto fail = [&](ErrorKind kind, const std::string& what) { Throw(kind, "node '" + op.name + "' (" + n.op + "): " + what); };
  Dims out;
  bool& identity = *is_identity;
  switch (op.kind) {
    case Kind::kPad: {
      op.pad = ResolvePad(n, known, x.size());
      out = x;
      identity = true;
      for (size_t a = 0; a < x.size(); ++a) {
        const int64_t b = op.pad.pads[a], e = op.pad.pads[x.size() + a];
        if (op.pad.mode == PadMode::kReflect && (b >= x[a] || e >= x[a]))
          fail(ErrorKind::kInvalidInput, "reflect pads of " + std::to_string(std::max(b, e)) + " on an axis of " + std::to_string(x[a]));
        if (op.pad.mode == PadMode::kEdge && x[a] == 0 && (b > 0 || e > 0)) fail(ErrorKind::kInvalidInput, "edge pads on an empty axis");
        out[a] += b + e;
        identity = identity && b == 0 && e == 0;
      }
      break;
    }
    case Kind::kReshape:
      out = ReshapedDims(n, known, x);
      identity = out == x;
      break;
    case Kind::kTranspose: {
      Dims perm = op.perm;
      if (perm.empty())
        for (size_t a = x.size(); a-- > 0;) perm.push_back(static_cast<int64_t>(a));
      Dims sorted = perm;
      std::sort(sorted.begin(), sorted.end());
      for (size_t a = 0; a < sorted.size(); ++a)
        if (sorted.size() != x.size() || sorted[a] != static_cast<int64_t>(a)) fail(ErrorKind::kInvalidInput, "perm is not a permutation of the input's axes");
      op.perm = perm;
      identity = true;
      for (size_t a = 0; a < perm.size(); ++a) {
        out.push_back(x[static_cast<size_t>(perm[a])]);
        identity = identity && perm[a] == static_cast<int64_t>(a);
      }
      break;
    }
    case Kind::kSlice: {
      op.slice = n.op == "Split" ? ResolveSplit(n, known, x, op.part) : ResolveSlice(n, known, x);
      out = op.slice.len;
      identity = out == x;
      for (size_t a = 0; a < x.size(); ++a) identity = identity && op.slice.start[a] == 0 && op.slice.step[a] == 1;
      break;
    }
    default: break;
  }
  return out;
}

// The output dims of `op` for an input of `x` (its first input); its padding, axes, pads,
// perm and slice made explicit. *is_identity: the op changes nothing (its readers are renamed).
Dims OpOutputDims(Executor::Op& op, const Dims& x, const std::function<Dims(const std::string&)>& dims_of,
                  const KnownFn& known, bool* is_identity) {
  const Node& n = op.node;
  auto fail = [&](ErrorKind kind, const std::string& what) { Throw(kind, "node '" + op.name + "' (" + n.op + "): " + what); };
  auto rank4 = [&] {
    if (x.size() != 4) fail(ErrorKind::kUnsupported, "expects an NCHW tensor; its input is " + DimsText(x));
  };
  Dims out;
  switch (op.kind) {
    case Kind::kConv: {
      rank4();
      const Dims& w = op.weights.dims;
      if (x[1] != w[1] * op.group)
        Throw(ErrorKind::kInvalidInput, "node '" + op.name + "': input has " + std::to_string(x[1]) +
                                            " channels, weights expect " + std::to_string(w[1] * op.group));
      out = {x[0], w[0], 0, 0};
      for (int a = 0; a < 2; ++a) {
        int64_t pb, pe;
        SpatialOut(op.auto_pad, x[2 + a], w[2 + a], op.strides[a], op.dilations[a], op.pads[a], op.pads[2 + a],
                   &out[2 + a], &pb, &pe);
        op.pads[a] = pb;
        op.pads[2 + a] = pe;
      }
      break;
    }
    case Kind::kPool:
      rank4();
      out = {x[0], x[1], 0, 0};
      for (int a = 0; a < 2; ++a) {
        int64_t pb, pe;
        SpatialOut(op.auto_pad, x[2 + a], op.kernel[a], op.strides[a], 1, op.pads[a], op.pads[2 + a], &out[2 + a],
                   &pb, &pe, op.ceil_mode != 0);
        // Averages counting the padding: ONNX counts the given padding, not ceil_mode's overhang.
        if (op.include_pad && pe != op.pads[2 + a])
          fail(ErrorKind::kUnsupported, "count_include_pad=1 with a ceil_mode window over the end is not supported");
        op.pads[a] = pb;
        op.pads[2 + a] = pe;
      }
      break;
    case Kind::kGlobalPool:
      rank4();
      out = op.keepdims ? Dims{x[0], x[1], 1, 1} : Dims{x[0], x[1]};
      break;
    case Kind::kEltwise: out = x; break;
    case Kind::kBinary: {
      bool ok;
      const Dims y = dims_of(op.inputs[1]);
      out = BroadcastDims(x, y, &ok);
      if (!ok) fail(ErrorKind::kInvalidInput, "inputs of " + DimsText(x) + " and " + DimsText(y) + " do not broadcast");
      if (out.size() > 6) fail(ErrorKind::kUnsupported, "rank above 6");
      break;
    }
    case Kind::kConcat: {
      out = x;
      op.axis = NormalizeAxis(n, op.axis, x.size());
      const auto ax = static_cast<size_t>(op.axis);
      for (size_t k = 1; k < op.inputs.size(); ++k) {
        const Dims y = dims_of(op.inputs[k]);
        bool same = y.size() == x.size();
        for (size_t a = 0; same && a < x.size(); ++a) same = a == ax || y[a] == x[a];
        if (!same) fail(ErrorKind::kInvalidInput, "inputs of " + DimsText(x) + " and " + DimsText(y) + " do not concatenate on axis " + std::to_string(ax));
        out[ax] += y[ax];
      }
      break;
    }
    case Kind::kGemm:
      if (x.size() != 2 || x[1] != op.weights.dims[1])
        fail(ErrorKind::kInvalidInput, "input of " + DimsText(x) + "; the weights take N x " + std::to_string(op.weights.dims[1]));
      out = {x[0], op.weights.dims[0]};
      break;
    case Kind::kPad:
    case Kind::kReshape:
    case Kind::kTranspose:
    case Kind::kSlice: out = DataMoveDims(op, x, known, is_identity); break;
    case Kind::kFold: break;  // refused above
  }
  return out;
}

// Throws for an input no op computes, a channel count the weights do not take, shapes that do
// not broadcast, an output that would be empty.
Resolved Resolve(std::vector<Executor::Op> ops, const Graph& g, const Dims& in_dims) {
  using Op = Executor::Op;
  Resolved r;
  r.shapes[g.input] = in_dims;
  std::map<std::string, std::string> rename;
  auto renamed = [&](const std::string& t) {
    auto it = rename.find(t);
    return it == rename.end() ? t : it->second;
  };
  const KnownFn known = [&](const std::string& t) -> const ConstTensor* {
    auto f = r.folded.find(t);
    return f != r.folded.end() ? &f->second : ConstOf(g, t);
  };
  const ShapeFn shape_of = [&](const std::string& t) -> const Dims* {
    auto it = r.shapes.find(t);
    return it == r.shapes.end() ? nullptr : &it->second;
  };
  for (Op& op : ops) {
    for (auto& in : op.inputs) in = renamed(in);
    for (auto& in : op.node.inputs) in = renamed(in);
    const Node& n = op.node;
    auto fail = [&](ErrorKind kind, const std::string& what) { Throw(kind, "node '" + op.name + "' (" + n.op + "): " + what); };
    if (op.kind != Kind::kConv && op.kind != Kind::kPool && op.kind != Kind::kGlobalPool && op.kind != Kind::kGemm) {
      std::vector<ConstTensor> outs;
      if (FoldNode(n, known, shape_of, &outs)) {
        for (size_t k = 0; k < outs.size() && k < n.outputs.size(); ++k) r.folded[n.outputs[k]] = std::move(outs[k]);
        continue;
      }
    }
    if (op.kind == Kind::kFold)
      fail(ErrorKind::kUnsupported, "runs on image tensors here; only shape arithmetic (folded once the input size is "
                                    "known) is supported for this operator");
    for (size_t k = 0; k < op.inputs.size(); ++k) {
      const std::string& in = op.inputs[k];
      const bool computed = r.shapes.count(in) != 0;
      if (!computed && !known(in)) fail(ErrorKind::kInvalidInput, "input '" + in + "' is not computed");
      const bool data_input = k == 0 || op.kind == Kind::kConcat;
      if (data_input && !computed && op.kind != Kind::kBinary)
        fail(ErrorKind::kUnsupported, "input '" + in + "' is a constant; the executor runs this operator on computed tensors");
    }
    auto dims_of = [&](const std::string& t) -> Dims {
      auto it = r.shapes.find(t);
      return it != r.shapes.end() ? it->second : known(t)->dims;
    };
    const Dims x = dims_of(op.inputs[0]);
    bool identity = false;
    const Dims out = OpOutputDims(op, x, dims_of, known, &identity);
    if (x.size() > 6 || out.size() > 6) fail(ErrorKind::kUnsupported, "tensors of rank above 6");
    // 2^34 floats (64 GiB): far beyond any activation; also keeps every size product in range.
    if (BoundedElements(out, int64_t{1} << 34) < 0)
      fail(ErrorKind::kUnsupported, "an output of " + DimsText(out) + " (more than 2^34 elements)");
    if (identity) {
      rename[op.output] = op.inputs[0];
      continue;
    }
    for (auto v : out)
      if (v <= 0)
        Throw(ErrorKind::kInvalidInput, "node '" + op.name + "': an input of " + DimsText(x) +
                                            " is too small (output would be empty)");
    r.shapes[op.output] = out;
    r.ops.push_back(std::move(op));
  }
  r.output = renamed(g.output);
  if (!r.shapes.count(r.output)) Throw(ErrorKind::kUnsupported, "the feature layer '" + g.output + "' is a constant");
  for (const auto& o : g.more_outputs) {
    r.more_outputs.push_back(renamed(o));
    if (!r.shapes.count(r.more_outputs.back())) Throw(ErrorKind::kUnsupported, "the feature layer '" + o + "' is a constant");
  }
  return r;
}

// Residual adds fused as a convolution's "sum" post-op, now that shapes are known: Add(conv_out,
// other) of equal shapes, where the convolution's output has no other reader and `other`
// exists when the convolution runs. A cut convolution output (`outs`) is computed too, by a copy
// of the convolution without the add.
std::vector<Executor::Op> FoldResidualAdds(std::vector<Executor::Op> ops, const std::map<std::string, Dims>& shapes,
                                           const std::vector<std::string>& outs) {
  using Op = Executor::Op;
  std::map<std::string, size_t> producer;
  auto uses = UseCounts(ops, {});
  const std::set<std::string> cuts(outs.begin(), outs.end());
  std::map<size_t, std::vector<Op>> copies;  // a cut convolution's output, computed as before the fold
  std::vector<char> dead(ops.size(), 0);
  for (size_t i = 0; i < ops.size(); ++i) {
    Op& op = ops[i];
    if (op.kind == Kind::kBinary && op.bin == algorithm::binary_add && shapes.count(op.inputs[0]) &&
        shapes.count(op.inputs[1]) && shapes.at(op.inputs[0]) == shapes.at(op.inputs[1])) {
      for (int side = 0; side < 2; ++side) {
        auto p = producer.find(op.inputs[side]);
        if (p == producer.end() || uses[op.inputs[side]] != 1) continue;
        Op& conv = ops[p->second];
        if (conv.kind != Kind::kConv || !conv.sum_input.empty()) continue;
        // The residual must already exist when the convolution runs.
        auto other = producer.find(op.inputs[1 - side]);
        if (other != producer.end() && other->second > p->second) continue;
        if (cuts.count(conv.output)) copies[p->second].push_back(conv);
        conv.sum_input = op.inputs[1 - side];
        conv.output = op.output;
        dead[i] = 1;
        producer[op.output] = p->second;
        break;
      }
      if (dead[i]) continue;
    }
    producer[op.output] = i;
  }
  return KeepLive(std::move(ops), dead, std::move(copies));
}

// Below this a magnitude's scale (and 1 / scale) would leave float's normal range.
constexpr float kTinyRange = 1e-30f;

// Builds one plan's primitives, op by op in execution order: the tensors planned so far, the
// pool of buffers they live in (a buffer is reused once its tensor's last reader has run) and,
// for int8, which tensors stay 8-bit and every tensor's scale.
class PlanBuilder {
 public:
  using dt = memory::data_type;
  using tag = memory::format_tag;

  struct Value {
    Dims dims;
    memory mem;
    int buffer = -1;
  };

  PlanBuilder(Executor::Plan& plan, const dnnl::engine& eng, dnnl::stream& strm, const Graph& g, const Resolved& r,
              Precision precision, const Executor::Ranges& ranges)
      : plan_(plan), eng_(eng), strm_(strm), g_(g), r_(r), precision_(precision), ranges_(ranges),
        // Activations and weights in this type; biases, the input and the features stay f32.
        // (int8: convolutions compute in 8 bits; the tensors they do not both write and read
        // stay f32.)
        act_(precision == Precision::kBF16 ? dt::bf16 : dt::f32) {}

  void Input(const Dims& in_dims) {
    plan_.input = memory(memory::desc(ToDims(in_dims), dt::f32, tag::abcd), eng_, nullptr);
    values_[g_.input] = Value{in_dims, plan_.input, -1};
  }

  // int8: which tensors stay 8-bit (a convolution's output that only convolutions read, not
  // the feature layer), and their type (u8 when the chain that ends the convolution cannot go
  // below zero).
  void ChooseInt8Types(const std::vector<Executor::Op>& ops) {
    if (precision_ != Precision::kInt8) return;
    std::set<std::string> read_elsewhere;
    for (const auto& o : r_.outputs()) read_elsewhere.insert(o);
    for (const Executor::Op& op : ops)
      if (op.kind != Kind::kConv) read_elsewhere.insert(op.inputs.begin(), op.inputs.end());
    for (const Executor::Op& op : ops) {
      if (op.kind != Kind::kConv || read_elsewhere.count(op.output)) continue;
      const auto& chain = op.sum_input.empty() ? op.post : op.post_sum;
      const bool nonneg = !chain.empty() && ((chain.back().alg == algorithm::eltwise_relu && chain.back().alpha == 0.f) ||
                                             (chain.back().alg == algorithm::eltwise_clip && chain.back().alpha >= 0.f) ||
                                             chain.back().alg == algorithm::eltwise_logistic);
      // A residual is added in the output's type: u8 only when the residual is u8 too.
      const bool residual_ok = op.sum_input.empty() || (qtype_.count(op.sum_input) && qtype_[op.sum_input] == dt::u8);
      qtype_[op.output] = nonneg && residual_ok ? dt::u8 : dt::s8;
    }
  }

  // Op `i`'s primitives; its inputs' buffers go back to the pool where it is their last reader.
  void Emit(Executor::Op& op, size_t i, const Dims& out_dims, const std::map<std::string, size_t>& last_use,
            bool observe) {
    std::vector<int> temps;
    try {
      if (op.kind == Kind::kBinary) {
        EmitBinary(op, out_dims, temps);
      } else {
        const Value& src = values_.at(op.inputs[0]);
        switch (op.kind) {
          case Kind::kConv: EmitConv(op, src, out_dims, temps); break;
          case Kind::kEltwise: EmitEltwise(op, src, out_dims); break;
          case Kind::kPool:
          case Kind::kGlobalPool: EmitPool(op, src, out_dims); break;
          case Kind::kConcat: EmitConcat(op, out_dims); break;
          case Kind::kGemm: EmitGemm(op, src, out_dims, temps); break;
          case Kind::kPad:
          case Kind::kReshape:
          case Kind::kTranspose:
          case Kind::kSlice: EmitDataMove(op, src, out_dims, temps); break;
          case Kind::kBinary:
          case Kind::kFold: break;  // above; folded by Resolve
        }
      }
    } catch (const dnnl::error& e) {
      Throw(ErrorKind::kUnsupported, "node '" + op.name + "': oneDNN could not build it: " + e.what());
    }
    if (observe) plan_.observations.push_back({plan_.steps.size(), op.output, values_.at(op.output).mem});
    for (int t : temps) free_list_.push_back(t);
    std::set<std::string> seen;
    auto release = [&](const std::string& t) {
      if (!seen.insert(t).second) return;
      auto it = values_.find(t);
      if (it != values_.end() && it->second.buffer >= 0 && last_use.at(t) == i) free_list_.push_back(it->second.buffer);
    };
    for (const auto& in : op.inputs) release(in);
    if (!op.sum_input.empty()) release(op.sum_input);
  }

  // Global average pooling of each cut tensor into plain [N, C, 1, 1], with `maps` each cut
  // tensor copied out plain too (Plan::maps), and the buffers handed to the plan.
  void Output(bool maps) {
    for (const std::string& t : maps ? r_.outputs() : std::vector<std::string>{}) {
      const Value& cut = values_.at(t);
      memory plain(PlainDesc(cut.dims, dt::f32), eng_);
      plan_.steps.push_back({dnnl::reorder(cut.mem, plain), {{DNNL_ARG_FROM, cut.mem}, {DNNL_ARG_TO, plain}}});
      plan_.maps.push_back({plain, cut.dims});
    }
    plan_.output = Pooled(r_.output, g_.output, &plan_.channels);
    for (size_t k = 0; k < r_.more_outputs.size(); ++k) {
      Executor::Plan::Cut more;
      more.output = Pooled(r_.more_outputs[k], g_.more_outputs[k], &more.channels);
      plan_.more.push_back(std::move(more));
    }
    for (auto& b : buffers_) plan_.buffers.push_back(b.data);
  }

 private:
  // The steps that pool tensor `t` (the feature layer `layer`) into a plain [N, C, 1, 1] f32
  // memory, which is returned; `channels` gets C.
  memory Pooled(const std::string& t, const std::string& layer, int64_t* channels) {
    const Value& cut = values_.at(t);
    if (cut.dims.size() != 4 && cut.dims.size() != 2)
      Throw(ErrorKind::kUnsupported, "the feature layer '" + layer + "' is " + DimsText(cut.dims) +
                                         "; expected an NCHW tensor (average-pooled) or N x features");
    *channels = cut.dims[1];
    memory out(memory::desc({cut.dims[0], cut.dims[1], 1, 1}, dt::f32, tag::abcd), eng_);
    if (cut.dims.size() == 2) {  // already one vector per image
      memory flat(PlainDesc(cut.dims, dt::f32), eng_, out.get_data_handle());
      plan_.steps.push_back({dnnl::reorder(cut.mem, flat), {{DNNL_ARG_FROM, cut.mem}, {DNNL_ARG_TO, flat}}});
      return out;
    }
    dnnl::pooling_v2_forward::desc d(dnnl::prop_kind::forward_inference, algorithm::pooling_avg_exclude_padding,
                                     cut.mem.get_desc(),
                                     memory::desc({cut.dims[0], cut.dims[1], 1, 1}, cut.mem.get_desc().data_type(), tag::any),
                                     {1, 1}, {cut.dims[2], cut.dims[3]}, {0, 0}, {0, 0}, {0, 0});
    dnnl::pooling_v2_forward::primitive_desc pd(d, eng_);
    memory pooled = pd.dst_desc() == out.get_desc() ? out : memory(pd.dst_desc(), eng_);
    plan_.steps.push_back({dnnl::pooling_v2_forward(pd), {{DNNL_ARG_SRC, cut.mem}, {DNNL_ARG_DST, pooled}}});
    if (pooled != out) plan_.steps.push_back({dnnl::reorder(pooled, out), {{DNNL_ARG_FROM, pooled}, {DNNL_ARG_TO, out}}});
    return out;
  }

  struct Buffer {
    size_t size;
    std::shared_ptr<void> data;
  };

  // The smallest free buffer that holds `bytes`, else a new one.
  int Take(size_t bytes) {
    int best = -1;
    for (size_t i = 0; i < free_list_.size(); ++i) {
      const Buffer& b = buffers_[static_cast<size_t>(free_list_[i])];
      if (b.size >= bytes && (best < 0 || b.size < buffers_[static_cast<size_t>(free_list_[static_cast<size_t>(best)])].size))
        best = static_cast<int>(i);
    }
    if (best >= 0) {
      int id = free_list_[static_cast<size_t>(best)];
      free_list_.erase(free_list_.begin() + best);
      return id;
    }
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
    if (!p) Throw(ErrorKind::kInternal, "executor: out of memory");
    buffers_.push_back({bytes, std::shared_ptr<void>(p, std::free)});
    return static_cast<int>(buffers_.size() - 1);
  }
  Value& NewValue(const std::string& name, const memory::desc& md, const Dims& dims) {
    int id = Take(md.get_size());
    Value v{dims, memory(md, eng_, buffers_[static_cast<size_t>(id)].data.get()), id};
    return values_[name] = v;
  }
  memory TempMemory(const memory::desc& md, std::vector<int>* temps) {
    int id = Take(md.get_size());
    temps->push_back(id);
    return memory(md, eng_, buffers_[static_cast<size_t>(id)].data.get());
  }
  // A view of `v` in format `md`, reordering into a temporary when the formats differ.
  memory AsFormat(const Value& v, const memory::desc& md, std::vector<int>* temps) {
    if (v.mem.get_desc() == md) return v.mem;
    memory m = TempMemory(md, temps);
    plan_.steps.push_back({dnnl::reorder(v.mem, m), {{DNNL_ARG_FROM, v.mem}, {DNNL_ARG_TO, m}}});
    return m;
  }
  // A constant as a plain f32 tensor of `dims` (its own dims, or them with leading 1s).
  memory ConstMemory(const ConstTensor& t, const Dims& dims) {
    memory m(PlainDesc(dims, dt::f32), eng_);
    std::memcpy(m.get_data_handle(), t.data.data(), t.data.size() * sizeof(float));
    plan_.buffers.push_back(std::make_shared<memory>(m));
    return m;
  }
  static memory::desc PlainDesc(const Dims& dims, dt type) {
    const Dims st = PlainStrides(dims);
    return memory::desc(ToDims(dims), type, memory::dims(st.begin(), st.end()));
  }
  // `v` as a plain f32 tensor (a reorder into a temporary when it is stored otherwise).
  memory Plain(const Value& v, std::vector<int>* temps) { return AsFormat(v, PlainDesc(v.dims, dt::f32), temps); }
  // A tensor the plan computes, or a constant (graph or folded), as plain f32 where needed.
  const ConstTensor* Known(const std::string& t) const {
    auto f = r_.folded.find(t);
    if (f != r_.folded.end()) return &f->second;
    auto c = g_.consts.find(t);
    return c == g_.consts.end() ? nullptr : &c->second;
  }
  // int8: a tensor's calibrated largest magnitude, and its scale (range / 127, or 255 for u8).
  float RangeOf(const std::string& t) const {
    auto it = ranges_.find(t);
    if (it == ranges_.end())
      Throw(ErrorKind::kInvalidInput, "executor: int8: no calibration range for tensor '" + t +
                                          "' (ranges from another model or cut?)");
    return it->second > kTinyRange ? it->second : 1.f;  // all (nearly) zero: any scale will do
  }
  float ScaleOf(const std::string& t) const {
    auto q = qtype_.find(t);
    return RangeOf(t) / (q != qtype_.end() && q->second == dt::u8 ? 255.f : 127.f);
  }

  void EmitConv(Executor::Op& op, const Value& src, const Dims& out_dims, std::vector<int>& temps) {
    // Leading affine steps fold into the weights: a*(W*x+b)+c = (aW)*x + (ab+c).
    ConstTensor w = op.weights, b = op.bias;
    while (!op.post.empty() && IsLinear(op.post.front())) {
      const EltStep s = op.post.front();
      for (auto& v : w.data) v *= s.alpha;
      for (auto& v : b.data) v = v * s.alpha + s.beta;
      op.post.erase(op.post.begin());
    }
    memory::dims wdims = op.group == 1
                             ? ToDims(w.dims)
                             : memory::dims{op.group, w.dims[0] / op.group, w.dims[1], w.dims[2], w.dims[3]};
    const bool int8 = precision_ == Precision::kInt8;
    // int8: the source as stored (8-bit) or quantized here (s8); the output 8-bit or f32.
    const std::string& src_name = op.inputs[0];
    const dt src_dt = !int8 ? act_ : qtype_.count(src_name) ? qtype_[src_name] : dt::s8;
    const dt dst_dt = !int8 ? act_ : qtype_.count(op.output) ? qtype_[op.output] : dt::f32;
    memory::desc src_any(ToDims(src.dims), src_dt, tag::any);
    memory::desc w_any(wdims, int8 ? dt::s8 : act_, tag::any);
    memory::desc b_md({w.dims[0]}, dt::f32, tag::a);
    memory::desc dst_any(ToDims(out_dims), dst_dt, tag::any);
    dnnl::primitive_attr attr, w_attr;
    float dst_scale = 1.f;
    if (int8) {
      // Weights per output channel; the sums scaled back by src scale x weight scale,
      // and the bias brought into the sums' units.
      const float s_src = ScaleOf(src_name);
      const int64_t oc = w.dims[0], per = static_cast<int64_t>(w.data.size()) / oc;
      std::vector<float> w_inv(static_cast<size_t>(oc)), out_scales(static_cast<size_t>(oc));
      for (int64_t o = 0; o < oc; ++o) {
        float m = 0;
        for (int64_t k = 0; k < per; ++k) m = std::max(m, std::fabs(w.data[static_cast<size_t>(o * per + k)]));
        const float s_w = m > kTinyRange ? m / 127.f : 1.f;  // a dead channel's denormals: 0
        w_inv[static_cast<size_t>(o)] = 1.f / s_w;
        out_scales[static_cast<size_t>(o)] = s_src * s_w;
        b.data[static_cast<size_t>(o)] /= s_src * s_w;
      }
      w_attr.set_output_scales(op.group == 1 ? 1 : 3, w_inv);
      attr.set_output_scales(1 << 1, out_scales);
      if (dst_dt != dt::f32) dst_scale = ScaleOf(op.output);
    }
    attr.set_post_ops(MakePostOps(op, dst_scale));
    memory::dims dil = {op.dilations[0] - 1, op.dilations[1] - 1};
    dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_inference, algorithm::convolution_direct,
                                      src_any, w_any, b_md, dst_any, ToDims(op.strides), dil,
                                      {op.pads[0], op.pads[1]}, {op.pads[2], op.pads[3]});
    dnnl::convolution_forward::primitive_desc pd(d, attr, eng_);
    memory s;
    if (!int8 || src.mem.get_desc().data_type() == pd.src_desc().data_type()) {
      s = AsFormat(src, pd.src_desc(), &temps);
    } else {  // int8 from an f32 tensor: quantized by a reorder
      s = TempMemory(pd.src_desc(), &temps);
      dnnl::primitive_attr q;
      q.set_output_scales(0, {1.f / ScaleOf(src_name)});
      plan_.steps.push_back({dnnl::reorder(dnnl::reorder::primitive_desc(src.mem, s, q)),
                             {{DNNL_ARG_FROM, src.mem}, {DNNL_ARG_TO, s}}});
    }
    memory user_w(memory::desc(wdims, dt::f32, op.group == 1 ? tag::oihw : tag::goihw), eng_, w.data.data());
    memory wm(pd.weights_desc(), eng_);
    dnnl::reorder(dnnl::reorder::primitive_desc(user_w, wm, w_attr)).execute(strm_, user_w, wm);
    strm_.wait();
    memory bm(b_md, eng_);
    std::memcpy(bm.get_data_handle(), b.data.data(), b.data.size() * sizeof(float));
    Value& dst = NewValue(op.output, pd.dst_desc(), out_dims);
    if (!op.sum_input.empty()) {
      // The residual goes into the output first, in the output's units (the sum post-op
      // brings it back: MakePostOps).
      const Value& res = values_.at(op.sum_input);
      dnnl::primitive_attr r;
      const float factor = (qtype_.count(op.sum_input) ? ScaleOf(op.sum_input) : 1.f) / dst_scale;
      if (factor != 1.f) r.set_output_scales(0, {factor});
      plan_.steps.push_back({dnnl::reorder(dnnl::reorder::primitive_desc(res.mem, dst.mem, r)),
                             {{DNNL_ARG_FROM, res.mem}, {DNNL_ARG_TO, dst.mem}}});
    }
    plan_.steps.push_back({dnnl::convolution_forward(pd),
                           {{DNNL_ARG_SRC, s}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_BIAS, bm}, {DNNL_ARG_DST, dst.mem}}});
  }

  void EmitEltwise(const Executor::Op& op, const Value& src, const Dims& out_dims) {
    memory::desc md = src.mem.get_desc();
    if (op.post.empty()) {
      Value& dst = NewValue(op.output, md, out_dims);
      plan_.steps.push_back({dnnl::reorder(src.mem, dst.mem), {{DNNL_ARG_FROM, src.mem}, {DNNL_ARG_TO, dst.mem}}});
      return;
    }
    // One jit primitive per step, in place after the first (oneDNN 2.6 runs eltwise
    // with post-ops on its reference kernel).
    memory from = src.mem;
    Value& dst = NewValue(op.output, md, out_dims);
    for (const auto& st : op.post) {
      dnnl::eltwise_forward::desc d(dnnl::prop_kind::forward_inference, st.alg, md, st.alpha, st.beta);
      dnnl::eltwise_forward::primitive_desc pd(d, eng_);
      plan_.steps.push_back({dnnl::eltwise_forward(pd), {{DNNL_ARG_SRC, from}, {DNNL_ARG_DST, dst.mem}}});
      from = dst.mem;
    }
  }

  // oneDNN's binary broadcasts its second input only: the computed input of the output's shape
  // goes first (Sub and Div swapped back by a post-op); where neither has it, a C++ step.
  void EmitBinary(const Executor::Op& op, const Dims& out_dims, std::vector<int>& temps) {
    const std::string *first = &op.inputs[0], *second = &op.inputs[1];
    auto full = [&](const std::string& t) { return values_.count(t) && values_.at(t).dims == out_dims; };
    algorithm alg = op.bin;
    dnnl::post_ops po;
    if (!full(*first) && full(*second)) {
      std::swap(first, second);
      if (alg == algorithm::binary_sub) po.append_eltwise(1.f, algorithm::eltwise_linear, -1.f, 0.f);  // -(b - a)
      if (alg == algorithm::binary_div) po.append_eltwise(1.f, algorithm::eltwise_pow, 1.f, -1.f);    // (b / a)^-1
    } else if (!full(*first)) {
      EmitBroadcastBinary(op, out_dims, temps);
      return;
    }
    const Value& src = values_.at(*first);
    memory m1;
    if (values_.count(*second)) {
      const Value& v1 = values_.at(*second);
      if (v1.dims == src.dims) {
        m1 = AsFormat(v1, src.mem.get_desc(), &temps);
      } else if (v1.dims.size() == src.dims.size()) {
        m1 = v1.mem;
      } else {  // fewer axes: the same plain values with leading 1s
        EmitBroadcastBinary(op, out_dims, temps);
        return;
      }
    } else {
      const ConstTensor& c = *Known(*second);
      Dims d1 = c.dims;
      while (d1.size() < src.dims.size()) d1.insert(d1.begin(), 1);
      m1 = ConstMemory(c, d1);
      if (src.mem.get_desc().data_type() != dt::f32) {  // the constant in the activations' type
        memory conv(PlainDesc(d1, src.mem.get_desc().data_type()), eng_);
        dnnl::reorder(m1, conv).execute(strm_, m1, conv);
        strm_.wait();
        plan_.buffers.push_back(std::make_shared<memory>(conv));
        m1 = conv;
      }
    }
    dnnl::primitive_attr attr;
    attr.set_post_ops(po);
    dnnl::binary::desc d(alg, src.mem.get_desc(), m1.get_desc(), src.mem.get_desc());
    dnnl::binary::primitive_desc pd(d, attr, eng_);
    Value& dst = NewValue(op.output, pd.dst_desc(), out_dims);
    plan_.steps.push_back(
        {dnnl::binary(pd), {{DNNL_ARG_SRC_0, src.mem}, {DNNL_ARG_SRC_1, m1}, {DNNL_ARG_DST, dst.mem}}});
  }

  // Both inputs broadcast (or ranks differ): plain f32 in C++.
  void EmitBroadcastBinary(const Executor::Op& op, const Dims& out_dims, std::vector<int>& temps) {
    memory in[2];
    Dims dims[2];
    for (int k = 0; k < 2; ++k) {
      const std::string& t = op.inputs[static_cast<size_t>(k)];
      if (values_.count(t)) {
        in[k] = Plain(values_.at(t), &temps);
        dims[k] = values_.at(t).dims;
      } else {
        dims[k] = Known(t)->dims;
        in[k] = ConstMemory(*Known(t), dims[k]);
      }
    }
    Value& dst = NewValue(op.output, PlainDesc(out_dims, dt::f32), out_dims);
    const BinaryOp bop = op.bin == algorithm::binary_add   ? BinaryOp::kAdd
                         : op.bin == algorithm::binary_sub ? BinaryOp::kSub
                         : op.bin == algorithm::binary_mul ? BinaryOp::kMul
                                                           : BinaryOp::kDiv;
    memory a = in[0], b = in[1], out = dst.mem;
    const Dims da = dims[0], db = dims[1];
    Executor::Plan::Step step;
    step.fn = [=] {
      BroadcastBinary(bop, static_cast<const float*>(a.get_data_handle()), da, static_cast<const float*>(b.get_data_handle()),
                      db, out_dims, static_cast<float*>(out.get_data_handle()));
    };
    plan_.steps.push_back(std::move(step));
  }

  // Gemm / MatMul by constant weights: oneDNN's inner product, its eltwise chain fused.
  void EmitGemm(Executor::Op& op, const Value& src, const Dims& out_dims, std::vector<int>& temps) {
    ConstTensor w = op.weights, b = op.bias;
    while (!op.post.empty() && IsLinear(op.post.front())) {  // a*(W x + b) + c = (aW) x + (ab + c)
      const EltStep s = op.post.front();
      for (auto& v : w.data) v *= s.alpha;
      for (auto& v : b.data) v = v * s.alpha + s.beta;
      op.post.erase(op.post.begin());
    }
    memory::desc src_md = PlainDesc(src.dims, dt::f32), w_any(ToDims(w.dims), dt::f32, tag::any),
                 b_md({w.dims[0]}, dt::f32, tag::a), dst_md = PlainDesc(out_dims, dt::f32);
    dnnl::primitive_attr attr;
    attr.set_post_ops(MakePostOps(op));
    dnnl::inner_product_forward::desc d(dnnl::prop_kind::forward_inference, src_md, w_any, b_md, dst_md);
    dnnl::inner_product_forward::primitive_desc pd(d, attr, eng_);
    memory s = AsFormat(src, pd.src_desc(), &temps);
    memory user_w(memory::desc(ToDims(w.dims), dt::f32, tag::ab), eng_, w.data.data());
    memory wm(pd.weights_desc(), eng_);
    dnnl::reorder(user_w, wm).execute(strm_, user_w, wm);
    strm_.wait();
    memory bm(b_md, eng_);
    std::memcpy(bm.get_data_handle(), b.data.data(), b.data.size() * sizeof(float));
    plan_.buffers.push_back(std::make_shared<memory>(wm));
    plan_.buffers.push_back(std::make_shared<memory>(bm));
    Value& dst = NewValue(op.output, pd.dst_desc(), out_dims);
    plan_.steps.push_back({dnnl::inner_product_forward(pd),
                           {{DNNL_ARG_SRC, s}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_BIAS, bm}, {DNNL_ARG_DST, dst.mem}}});
  }

  // Pad, Reshape (Flatten, Squeeze, Unsqueeze), Transpose, Slice (Split): plain f32 in C++.
  void EmitDataMove(const Executor::Op& op, const Value& src, const Dims& out_dims, std::vector<int>& temps) {
    memory in = Plain(src, &temps);
    Value& dst = NewValue(op.output, PlainDesc(out_dims, dt::f32), out_dims);
    memory out = dst.mem;
    const Dims x = src.dims;
    Executor::Plan::Step step;
    auto from = [in] { return static_cast<const float*>(in.get_data_handle()); };
    auto to = [out] { return static_cast<float*>(out.get_data_handle()); };
    if (op.kind == Kind::kPad) {
      const PadSpec p = op.pad;
      step.fn = [=] { PadCopy(from(), x, p.pads, p.mode, p.value, to()); };
    } else if (op.kind == Kind::kReshape) {
      const size_t bytes = static_cast<size_t>(NumElements(x)) * sizeof(float);
      step.fn = [=] { std::memcpy(to(), from(), bytes); };
    } else {
      const Dims st = PlainStrides(x);
      Dims strides(out_dims.size());
      int64_t offset = 0;
      for (size_t a = 0; a < out_dims.size(); ++a) {
        if (op.kind == Kind::kTranspose) {
          strides[a] = st[static_cast<size_t>(op.perm[a])];
        } else {
          offset += op.slice.start[a] * st[a];
          strides[a] = op.slice.step[a] * st[a];
        }
      }
      step.fn = [=] { StridedCopy(from(), offset, strides, out_dims, to()); };
    }
    plan_.steps.push_back(std::move(step));
  }

  void EmitPool(const Executor::Op& op, const Value& src, const Dims& out_dims) {
    memory::dims kernel, strides{1, 1}, pl{0, 0}, pr{0, 0};
    if (op.kind == Kind::kGlobalPool) {
      kernel = {src.dims[2], src.dims[3]};
    } else {
      kernel = ToDims(op.kernel);
      strides = ToDims(op.strides);
      pl = {op.pads[0], op.pads[1]};
      pr = {op.pads[2], op.pads[3]};
    }
    if (out_dims.size() == 2) {  // ReduceMean without keepdims: pooled into plain N x C x 1 x 1, read as N x C
      const memory::desc md4 = PlainDesc({out_dims[0], out_dims[1], 1, 1}, src.mem.get_desc().data_type());
      dnnl::pooling_v2_forward::desc d(dnnl::prop_kind::forward_inference, op.pool, src.mem.get_desc(), md4, strides,
                                       kernel, {0, 0}, pl, pr);
      dnnl::pooling_v2_forward::primitive_desc pd(d, eng_);
      Value& dst = NewValue(op.output, PlainDesc(out_dims, src.mem.get_desc().data_type()), out_dims);
      memory pooled(md4, eng_, dst.mem.get_data_handle());
      plan_.steps.push_back({dnnl::pooling_v2_forward(pd), {{DNNL_ARG_SRC, src.mem}, {DNNL_ARG_DST, pooled}}});
      return;
    }
    memory::desc dst_any(ToDims(out_dims), src.mem.get_desc().data_type(), tag::any);
    dnnl::pooling_v2_forward::desc d(dnnl::prop_kind::forward_inference, op.pool, src.mem.get_desc(), dst_any,
                                     strides, kernel, {0, 0}, pl, pr);
    dnnl::pooling_v2_forward::primitive_desc pd(d, eng_);
    Value& dst = NewValue(op.output, pd.dst_desc(), out_dims);
    plan_.steps.push_back({dnnl::pooling_v2_forward(pd), {{DNNL_ARG_SRC, src.mem}, {DNNL_ARG_DST, dst.mem}}});
  }

  void EmitConcat(const Executor::Op& op, const Dims& out_dims) {
    std::vector<memory::desc> mds;
    std::vector<memory> mems;
    for (const auto& in : op.inputs) {
      mems.push_back(values_.at(in).mem);
      mds.push_back(mems.back().get_desc());
    }
    dnnl::concat::primitive_desc pd(static_cast<int>(op.axis), mds, eng_);
    Value& dst = NewValue(op.output, pd.dst_desc(), out_dims);
    std::unordered_map<int, memory> args{{DNNL_ARG_DST, dst.mem}};
    for (size_t k = 0; k < mems.size(); ++k) args[DNNL_ARG_MULTIPLE_SRC + static_cast<int>(k)] = mems[k];
    plan_.steps.emplace_back(dnnl::concat(pd), args);
  }

  Executor::Plan& plan_;
  const dnnl::engine& eng_;
  dnnl::stream& strm_;
  const Graph& g_;
  const Resolved& r_;
  const Precision precision_;
  const Executor::Ranges& ranges_;
  const dt act_;
  std::map<std::string, Value> values_;
  std::vector<Buffer> buffers_;
  std::vector<int> free_list_;
  std::map<std::string, dt> qtype_;
};

}  // namespace

Executor::Plan& Executor::PlanFor(const std::array<int64_t, 4>& shape, PlanKind kind) {
  const bool observe = kind == PlanKind::kObserve;
  auto& cache = observe ? observe_plans_ : kind == PlanKind::kMaps ? maps_plans_ : plans_;
  auto found = cache.find(shape);
  if (found != cache.end()) return *found->second;
  for (size_t i = 0; i < 4; ++i) {
    if (shape[i] <= 0) Throw(ErrorKind::kInvalidInput, "executor: input dims must be positive");
    if (graph_.input_dims[i] > 0 && graph_.input_dims[i] != shape[i])
      Throw(ErrorKind::kInvalidInput, "executor: input '" + graph_.input + "' dim " + std::to_string(i) +
                                          " is fixed at " + std::to_string(graph_.input_dims[i]) + " by the model, got " +
                                          std::to_string(shape[i]));
  }
  auto plan = std::make_unique<Plan>();
  const Dims in_dims(shape.begin(), shape.end());
  const Resolved r = Resolve(ops_, graph_, in_dims);
  const std::map<std::string, Dims>& shapes = r.shapes;
  std::vector<Op> ops = FuseEltwise(FoldResidualAdds(r.ops, shapes, r.outputs()), r.outputs());
  // Last use of each tensor, to return buffers to the pool.
  std::map<std::string, size_t> last_use;
  for (size_t i = 0; i < ops.size(); ++i) {
    for (const auto& in : ops[i].inputs) last_use[in] = i;
    if (!ops[i].sum_input.empty()) last_use[ops[i].sum_input] = i;
  }
  for (const auto& o : r.outputs()) last_use[o] = ops.size();  // pooled after the last op

  PlanBuilder b(*plan, engine_->eng, engine_->strm, graph_, r, observe ? Precision::kF32 : precision_, ranges_);
  b.Input(in_dims);
  b.ChooseInt8Types(ops);
  for (size_t i = 0; i < ops.size(); ++i) b.Emit(ops[i], i, shapes.at(ops[i].output), last_use, observe);
  b.Output(kind == PlanKind::kMaps);
  Plan& ref = *plan;
  cache[shape] = std::move(plan);
  return ref;
}

namespace {

bool SameSteps(const std::vector<EltStep>& a, const std::vector<EltStep>& b) {
  auto bits = [](float v) { return std::bit_cast<uint32_t>(v); };
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].alg != b[i].alg || bits(a[i].alpha) != bits(b[i].alpha) || bits(a[i].beta) != bits(b[i].beta)) return false;
  return true;
}

// Whether two fused ops compute the same thing the same way: the same node(s), inputs, output
// and fused chains (the primitives built from them are then the same).
bool SameOp(const Executor::Op& a, const Executor::Op& b) {
  return a.kind == b.kind && a.name == b.name && a.inputs == b.inputs && a.output == b.output &&
         a.sum_input == b.sum_input && a.part == b.part && a.pads == b.pads && a.strides == b.strides &&
         SameSteps(a.post, b.post) && SameSteps(a.post_sum, b.post_sum);
}

}  // namespace

std::vector<bool> Executor::CutsAsAlone(int64_t c, int64_t h, int64_t w) const {
  const int64_t n = graph_.input_dims.empty() || graph_.input_dims[0] <= 0 ? 1 : graph_.input_dims[0];
  const Dims in{n, c, h, w};
  const Resolved all = Resolve(ops_, graph_, in);
  const std::vector<Op> fused = FuseEltwise(FoldResidualAdds(all.ops, all.shapes, all.outputs()), all.outputs());
  const std::vector<std::string> cuts = Outputs(graph_), resolved = all.outputs();
  std::vector<bool> same;
  for (size_t k = 0; k < cuts.size(); ++k) {
    Graph alone = graph_;  // the model cut at this tensor only, as ImportOnnx would give it
    alone.output = cuts[k];
    alone.more_outputs.clear();
    const std::vector<Op> unfused = BuildOps(alone);
    const Resolved r = Resolve(unfused, alone, in);
    const std::vector<Op> want = FuseEltwise(FoldResidualAdds(r.ops, r.shapes, {r.output}), {r.output});
    const std::vector<Op> got = DropDeadOps(fused, {resolved[k]});  // the several-cut plan's ops this cut needs
    bool equal = r.output == resolved[k] && want.size() == got.size();
    for (size_t i = 0; equal && i < want.size(); ++i) equal = SameOp(want[i], got[i]);
    same.push_back(equal);
  }
  return same;
}

void Executor::CheckShape(int64_t n, int64_t c, int64_t h, int64_t w) const {
  const Dims in{n, c, h, w};
  for (size_t i = 0; i < 4; ++i)
    if (graph_.input_dims[i] > 0 && graph_.input_dims[i] != in[i])
      Throw(ErrorKind::kInvalidInput, "executor: input '" + graph_.input + "' dim " + std::to_string(i) +
                                          " is fixed at " + std::to_string(graph_.input_dims[i]) + " by the model, got " +
                                          std::to_string(in[i]));
  const Resolved r = Resolve(ops_, graph_, in);
  const std::vector<std::string> layers = Outputs(graph_), cuts = r.outputs();
  for (size_t k = 0; k < cuts.size(); ++k) {
    const Dims& cut = r.shapes.at(cuts[k]);
    if (cut.size() != 4 && cut.size() != 2)
      Throw(ErrorKind::kUnsupported, "the feature layer '" + layers[k] + "' is " + DimsText(cut) +
                                         "; expected an NCHW tensor (average-pooled) or N x features");
  }
}

}  // namespace msaflow::kernels
