// An ONNX node's executor op, and the graph's ops (kernels/executor_parts.h).
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
#include "kernels/executor_parts.h"
#include "kernels/fold.h"
#include "kernels/tensor_ops.h"
#include "kernels/window.h"

namespace msaflow::kernels::exec {

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
  op.pool = n.op == "MaxPool" ? algorithm::pooling_max
            : op.include_pad  ? algorithm::pooling_avg_include_padding
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
  std::vector<int64_t> axes = IntsArg(
      n, 1, "axes", [&](const std::string& t) { return ConstOf(g, t); }, &present);
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
    for (int64_t r = 0; r < o; ++r)
      op.bias.data[static_cast<size_t>(r)] = beta * c->data[c->numel() == 1 ? 0 : static_cast<size_t>(r)];
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
    return MakeEltwise(n, n.inputs[0],
                       {{algorithm::eltwise_hardswish, 0.f, 0.f}, {algorithm::eltwise_linear, 6.f, 0.f}});
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
  // A Cast of a computed tensor to float16 and back (a rounding: what a tensor stored as float16
  // holds) runs; any other Cast is shape arithmetic, folded.
  if (t == "Cast" && (n.Int("to", 0) == kOnnxFloat16 || n.Int("to", 0) == kOnnxFloat))
    return MakeDataMove(n, Kind::kCast);
  if (t == "Shape" || t == "Gather" || t == "Cast" || t == "ConstantOfShape") return MakeDataMove(n, Kind::kFold);
  Unsupported(n, "operator is not supported by the msaflow executor");
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

}  // namespace msaflow::kernels::exec
