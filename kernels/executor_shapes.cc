// One input shape's executor ops resolved (kernels/executor_parts.h).
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

std::string DimsText(const Dims& d) {
  std::string t;
  for (int64_t v : d) t += (t.empty() ? "" : "x") + std::to_string(v);
  return t.empty() ? "scalar" : t;
}

// Pad, Reshape, Transpose and Slice: their specs read (pads, target shape, perm, starts) and
// their output dims.
Dims DataMoveDims(Executor::Op& op, const Dims& x, const KnownFn& known, bool* is_identity) {
  const Node& n = op.node;
  auto fail = [&](ErrorKind kind, const std::string& what) {
    Throw(kind, "node '" + op.name + "' (" + n.op + "): " + what);
  };
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
          fail(ErrorKind::kInvalidInput,
               "reflect pads of " + std::to_string(std::max(b, e)) + " on an axis of " + std::to_string(x[a]));
        if (op.pad.mode == PadMode::kEdge && x[a] == 0 && (b > 0 || e > 0))
          fail(ErrorKind::kInvalidInput, "edge pads on an empty axis");
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
        if (sorted.size() != x.size() || sorted[a] != static_cast<int64_t>(a))
          fail(ErrorKind::kInvalidInput, "perm is not a permutation of the input's axes");
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
    default:
      break;
  }
  return out;
}

// The output dims of `op` for an input of `x` (its first input); its padding, axes, pads,
// perm and slice made explicit. *is_identity: the op changes nothing (its readers are renamed).
Dims OpOutputDims(Executor::Op& op, const Dims& x, const std::function<Dims(const std::string&)>& dims_of,
                  const KnownFn& known, bool* is_identity) {
  const Node& n = op.node;
  auto fail = [&](ErrorKind kind, const std::string& what) {
    Throw(kind, "node '" + op.name + "' (" + n.op + "): " + what);
  };
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
        SpatialOut(op.auto_pad, x[2 + a], op.kernel[a], op.strides[a], 1, op.pads[a], op.pads[2 + a], &out[2 + a], &pb,
                   &pe, op.ceil_mode != 0);
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
    case Kind::kEltwise:
      out = x;
      break;
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
        if (!same)
          fail(ErrorKind::kInvalidInput, "inputs of " + DimsText(x) + " and " + DimsText(y) +
                                             " do not concatenate on axis " + std::to_string(ax));
        out[ax] += y[ax];
      }
      break;
    }
    case Kind::kGemm:
      if (x.size() != 2 || x[1] != op.weights.dims[1])
        fail(ErrorKind::kInvalidInput,
             "input of " + DimsText(x) + "; the weights take N x " + std::to_string(op.weights.dims[1]));
      out = {x[0], op.weights.dims[0]};
      break;
    case Kind::kPad:
    case Kind::kReshape:
    case Kind::kTranspose:
    case Kind::kSlice:
      out = DataMoveDims(op, x, known, is_identity);
      break;
    case Kind::kCast:
      out = x;
      break;
    case Kind::kFold:
      break;  // refused above
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
  std::set<std::string> halves;  // outputs of a Cast to float16
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
    auto fail = [&](ErrorKind kind, const std::string& what) {
      Throw(kind, "node '" + op.name + "' (" + n.op + "): " + what);
    };
    if (op.kind != Kind::kConv && op.kind != Kind::kPool && op.kind != Kind::kGlobalPool && op.kind != Kind::kGemm) {
      std::vector<ConstTensor> outs;
      if (FoldNode(n, known, shape_of, &outs)) {
        for (size_t k = 0; k < outs.size() && k < n.outputs.size(); ++k) r.folded[n.outputs[k]] = std::move(outs[k]);
        continue;
      }
    }
    const bool to_half = op.kind == Kind::kCast && n.Int("to", 0) == kOnnxFloat16;
    for (const auto& in : op.inputs)
      if (halves.count(in) && !(op.kind == Kind::kCast && !to_half))
        fail(ErrorKind::kUnsupported, "input '" + in +
                                          "' is float16: the executor computes in f32, and runs a Cast to float16 "
                                          "only where a Cast back to float reads it (a rounding)");
    if (to_half) halves.insert(n.outputs[0]);
    if (op.kind == Kind::kFold)
      fail(ErrorKind::kUnsupported,
           "runs on image tensors here; only shape arithmetic (folded once the input size is "
           "known) is supported for this operator");
    for (size_t k = 0; k < op.inputs.size(); ++k) {
      const std::string& in = op.inputs[k];
      const bool computed = r.shapes.count(in) != 0;
      if (!computed && !known(in)) fail(ErrorKind::kInvalidInput, "input '" + in + "' is not computed");
      const bool data_input = k == 0 || op.kind == Kind::kConcat;
      if (data_input && !computed && op.kind != Kind::kBinary)
        fail(ErrorKind::kUnsupported,
             "input '" + in + "' is a constant; the executor runs this operator on computed tensors");
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
        Throw(ErrorKind::kInvalidInput,
              "node '" + op.name + "': an input of " + DimsText(x) + " is too small (output would be empty)");
    r.shapes[op.output] = out;
    r.ops.push_back(std::move(op));
  }
  r.output = renamed(g.output);
  if (!r.shapes.count(r.output)) Throw(ErrorKind::kUnsupported, "the feature layer '" + g.output + "' is a constant");
  for (const auto& o : g.more_outputs) {
    r.more_outputs.push_back(renamed(o));
    if (!r.shapes.count(r.more_outputs.back()))
      Throw(ErrorKind::kUnsupported, "the feature layer '" + o + "' is a constant");
  }
  return r;
}

}  // namespace msaflow::kernels::exec
