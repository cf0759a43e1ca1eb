#include "kernels/fold.h"

#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/error.h"

namespace msaflow::kernels {
namespace {

[[noreturn]] void Bad(const Node& n, ErrorKind kind, const std::string& what) {
  Throw(kind, "node '" + n.name + "' (" + n.op + "): " + what);
}

// Above this a folded tensor is not shape arithmetic: an activation-sized constant.
constexpr int64_t kMaxFoldedElements = int64_t{1} << 24;
// Pads, steps and split sizes beyond this are no tensor's: refused before any arithmetic on them.
constexpr int64_t kMaxExtent = int64_t{1} << 32;

// A float read where an integer is meant (a float shape tensor, a Cast to int64), truncated;
// NaN, infinities and values past int64 are refused rather than converted (undefined in C++).
int64_t ToInt(double v) {
  if (!(v > -9.2e18 && v < 9.2e18))
    Throw(ErrorKind::kInvalidInput, "shape arithmetic: " + std::to_string(v) + " where an integer is expected");
  return static_cast<int64_t>(v);
}

ConstTensor Make(const TensorDims& dims, bool is_int) {
  // Checked before anything is allocated: a hostile model cannot make a fold claim gigabytes.
  if (BoundedElements(dims, kMaxFoldedElements) < 0)
    Throw(ErrorKind::kUnsupported, "shape arithmetic: a constant of more than " + std::to_string(kMaxFoldedElements) +
                                       " elements (or a negative dim)");
  ConstTensor t;
  t.dims = dims;
  const auto n = static_cast<size_t>(NumElements(dims));
  t.data.assign(n, 0.f);
  t.is_int = is_int;
  if (is_int) t.ints.assign(n, 0);
  return t;
}

double At(const ConstTensor& t, int64_t i) {
  const auto k = static_cast<size_t>(i);
  return t.is_int ? static_cast<double>(t.ints[k]) : static_cast<double>(t.data[k]);
}

void Set(ConstTensor& t, int64_t i, double v) {
  const auto k = static_cast<size_t>(i);
  if (t.is_int) {
    t.ints[k] = ToInt(v);
    t.data[k] = static_cast<float>(t.ints[k]);
  } else {
    t.data[k] = static_cast<float>(v);
  }
}

// out[i] = src[index[i]], for both the float and the integer values.
ConstTensor Take(const ConstTensor& src, const TensorDims& dims, const std::vector<int64_t>& index) {
  ConstTensor t = Make(dims, src.is_int);
  for (size_t i = 0; i < index.size(); ++i) {
    const auto k = static_cast<size_t>(index[i]);
    t.data[i] = src.data[k];
    if (src.is_int) t.ints[i] = src.ints[k];
  }
  return t;
}

// The source index of every element of a strided view (see StridedCopy).
std::vector<int64_t> StridedIndex(int64_t offset, const TensorDims& strides, const TensorDims& out) {
  std::vector<int64_t> index(static_cast<size_t>(NumElements(out)));
  TensorDims idx(out.size(), 0);
  for (auto& v : index) {
    int64_t at = offset;
    for (size_t a = 0; a < idx.size(); ++a) at += idx[a] * strides[a];
    v = at;
    for (size_t a = out.size(); a-- > 0;) {
      if (++idx[a] < out[a]) break;
      idx[a] = 0;
    }
  }
  return index;
}

const ConstTensor& Input(const Node& n, size_t i, const KnownFn& known) {
  if (i >= n.inputs.size() || n.inputs[i].empty()) Bad(n, ErrorKind::kInvalidInput, "input " + std::to_string(i) + " is missing");
  const ConstTensor* t = known(n.inputs[i]);
  if (!t) Bad(n, ErrorKind::kUnsupported, "input '" + n.inputs[i] + "' must be known when the plan is compiled");
  return *t;
}

std::vector<int64_t> AsInts(const ConstTensor& t) {
  if (t.is_int) return t.ints;
  std::vector<int64_t> v;
  for (float f : t.data) v.push_back(ToInt(f));
  return v;
}

ConstTensor FromInts(const TensorDims& dims, const std::vector<int64_t>& v) {
  ConstTensor t = Make(dims, true);
  for (size_t i = 0; i < v.size(); ++i) {
    t.ints[i] = v[i];
    t.data[i] = static_cast<float>(v[i]);
  }
  return t;
}

ConstTensor Arithmetic(const Node& n, const ConstTensor& a, const ConstTensor& b) {
  bool ok;
  TensorDims out = BroadcastDims(a.dims, b.dims, &ok);
  if (!ok) Bad(n, ErrorKind::kInvalidInput, "inputs of shapes that do not broadcast");
  const bool ints = a.is_int && b.is_int;
  ConstTensor t = Make(out, ints);
  const TensorDims sa = BroadcastStrides(a.dims, out), sb = BroadcastStrides(b.dims, out);
  const std::vector<int64_t> ia = StridedIndex(0, sa, out), ib = StridedIndex(0, sb, out);
  for (size_t i = 0; i < ia.size(); ++i) {
    const auto k = static_cast<int64_t>(i);
    if (ints) {
      const int64_t x = a.ints[static_cast<size_t>(ia[i])], y = b.ints[static_cast<size_t>(ib[i])];
      int64_t r = 0;
      bool overflow = false;
      if (n.op == "Add") {
        overflow = __builtin_add_overflow(x, y, &r);
      } else if (n.op == "Sub") {
        overflow = __builtin_sub_overflow(x, y, &r);
      } else if (n.op == "Mul") {
        overflow = __builtin_mul_overflow(x, y, &r);
      } else {
        if (y == 0) Bad(n, ErrorKind::kInvalidInput, "integer division by zero");
        overflow = x == std::numeric_limits<int64_t>::min() && y == -1;
        if (!overflow) r = x / y;  // ONNX integer Div truncates, as C does
      }
      if (overflow) Bad(n, ErrorKind::kInvalidInput, "integer overflow in shape arithmetic");
      t.ints[i] = r;
      t.data[i] = static_cast<float>(r);
    } else {
      const double x = At(a, ia[i]), y = At(b, ib[i]);
      Set(t, k, n.op == "Add" ? x + y : n.op == "Sub" ? x - y : n.op == "Mul" ? x * y : x / y);
    }
  }
  return t;
}

}  // namespace

int64_t NormalizeAxis(const Node& n, int64_t axis, size_t rank) {
  const auto r = static_cast<int64_t>(rank);
  if (axis < -r || axis >= r)
    Bad(n, ErrorKind::kInvalidInput, "axis " + std::to_string(axis) + " is outside a rank-" + std::to_string(r) + " tensor");
  return axis < 0 ? axis + r : axis;
}

std::vector<int64_t> IntsArg(const Node& n, size_t input, const std::string& attr, const KnownFn& known, bool* present) {
  *present = true;
  if (!attr.empty() && n.Has(attr)) return n.Ints(attr);
  if (input < n.inputs.size() && !n.inputs[input].empty()) return AsInts(Input(n, input, known));
  *present = false;
  return {};
}

TensorDims ReshapedDims(const Node& n, const KnownFn& known, const TensorDims& in) {
  const int64_t total = NumElements(in);
  if (n.op == "Flatten") {
    const auto axis = static_cast<size_t>(n.Int("axis", 1) < 0 ? n.Int("axis", 1) + static_cast<int64_t>(in.size()) : n.Int("axis", 1));
    if (axis > in.size()) Bad(n, ErrorKind::kInvalidInput, "axis beyond the input's rank");
    int64_t outer = 1;
    for (size_t a = 0; a < axis; ++a) outer *= in[a];
    return {outer, outer == 0 ? 0 : total / outer};
  }
  bool present;
  std::vector<int64_t> axes = IntsArg(n, 1, "axes", known, &present);
  if (n.op == "Squeeze") {
    std::vector<char> drop(in.size(), 0);
    if (!present) {
      for (size_t a = 0; a < in.size(); ++a) drop[a] = in[a] == 1 ? 1 : 0;
    }
    for (int64_t ax : axes) {
      const auto a = static_cast<size_t>(NormalizeAxis(n, ax, in.size()));
      if (in[a] != 1) Bad(n, ErrorKind::kInvalidInput, "axis " + std::to_string(ax) + " has size " + std::to_string(in[a]) + ", not 1");
      drop[a] = 1;
    }
    TensorDims out;
    for (size_t a = 0; a < in.size(); ++a)
      if (!drop[a]) out.push_back(in[a]);
    return out;
  }
  if (n.op == "Unsqueeze") {
    if (!present) Bad(n, ErrorKind::kInvalidInput, "no axes");
    const size_t rank = in.size() + axes.size();
    std::vector<char> one(rank, 0);
    for (int64_t ax : axes) {
      const auto a = static_cast<size_t>(NormalizeAxis(n, ax, rank));
      if (one[a]) Bad(n, ErrorKind::kInvalidInput, "axis " + std::to_string(ax) + " given twice");
      one[a] = 1;
    }
    TensorDims out;
    size_t next = 0;
    for (size_t a = 0; a < rank; ++a) out.push_back(one[a] ? 1 : in[next++]);
    return out;
  }
  // Reshape
  std::vector<int64_t> shape = n.Has("shape") ? n.Ints("shape") : AsInts(Input(n, 1, known));
  const bool allowzero = n.Int("allowzero", 0) != 0;
  TensorDims out(shape.size());
  int64_t known_product = 1, infer = -1;
  for (size_t a = 0; a < shape.size(); ++a) {
    int64_t d = shape[a];
    if (d == 0 && !allowzero) {
      if (a >= in.size()) Bad(n, ErrorKind::kInvalidInput, "shape copies dim " + std::to_string(a) + " the input lacks");
      d = in[a];
    }
    if (d == -1) {
      if (infer >= 0) Bad(n, ErrorKind::kInvalidInput, "more than one -1 in the target shape");
      infer = static_cast<int64_t>(a);
      continue;
    }
    if (d < 0) Bad(n, ErrorKind::kInvalidInput, "negative dim " + std::to_string(d) + " in the target shape");
    if (d > 0 && known_product > total / d + 1) Bad(n, ErrorKind::kInvalidInput, "a target shape larger than its input");
    out[a] = d;
    known_product *= d;
  }
  if (infer >= 0) {
    if (known_product == 0 || total % known_product != 0)
      Bad(n, ErrorKind::kInvalidInput, "cannot infer the -1 dim: " + std::to_string(total) + " elements");
    out[static_cast<size_t>(infer)] = total / known_product;
  } else if (known_product != total) {
    std::string d;
    for (int64_t v : out) d += (d.empty() ? "" : "x") + std::to_string(v);
    Bad(n, ErrorKind::kInvalidInput, "a tensor of " + std::to_string(total) + " elements cannot take the shape " + d);
  }
  return out;
}

SliceSpec ResolveSlice(const Node& n, const KnownFn& known, const TensorDims& in) {
  bool present;
  std::vector<int64_t> starts = IntsArg(n, 1, n.Has("starts") ? "starts" : "", known, &present);
  std::vector<int64_t> ends = IntsArg(n, 2, n.Has("ends") ? "ends" : "", known, &present);
  std::vector<int64_t> axes = IntsArg(n, 3, n.Has("starts") ? "axes" : "", known, &present);
  if (!present) {
    for (size_t a = 0; a < starts.size(); ++a) axes.push_back(static_cast<int64_t>(a));
  }
  std::vector<int64_t> steps = IntsArg(n, 4, "", known, &present);
  if (!present) steps.assign(starts.size(), 1);
  if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size())
    Bad(n, ErrorKind::kInvalidInput, "starts, ends, axes and steps differ in length");
  SliceSpec s{TensorDims(in.size(), 0), TensorDims(in.size(), 1), in};
  for (size_t k = 0; k < starts.size(); ++k) {
    const auto a = static_cast<size_t>(NormalizeAxis(n, axes[k], in.size()));
    const int64_t d = in[a], step = steps[k];
    if (step == 0 || step > kMaxExtent || step < -kMaxExtent)
      Bad(n, ErrorKind::kInvalidInput, "a step of " + std::to_string(step) + "; expected a non-zero step within ±2^32");
    auto fix = [d](int64_t v) { return v < 0 ? (v < -d ? -1 : v + d) : v; };  // -1: before the start
    int64_t b = fix(starts[k]), e = fix(ends[k]);
    if (step > 0) {
      b = std::clamp<int64_t>(b, 0, d);
      e = std::clamp<int64_t>(e, 0, d);
    } else {
      b = std::clamp<int64_t>(b, -1, d - 1);
      e = std::clamp<int64_t>(e, -1, d - 1);
    }
    const int64_t len = step > 0 ? (e - b + step - 1) / step : (b - e + (-step) - 1) / (-step);
    s.start[a] = b;
    s.step[a] = step;
    s.len[a] = std::max<int64_t>(0, len);
  }
  return s;
}

SliceSpec ResolveSplit(const Node& n, const KnownFn& known, const TensorDims& in, size_t k) {
  const auto axis = static_cast<size_t>(NormalizeAxis(n, n.Int("axis", 0), in.size()));
  bool present;
  std::vector<int64_t> sizes = IntsArg(n, 1, "split", known, &present);
  const auto parts = static_cast<int64_t>(n.outputs.size());
  if (!present) {  // equal parts (opset 18: the last one smaller)
    const int64_t each = (in[axis] + parts - 1) / parts;
    for (int64_t p = 0; p < parts; ++p) sizes.push_back(std::min(each, in[axis] - p * each));
  }
  int64_t total = 0;
  for (int64_t v : sizes) {
    if (v < 0 || v > kMaxExtent) Bad(n, ErrorKind::kInvalidInput, "a split size of " + std::to_string(v));
    total += v;
  }
  if (sizes.size() != n.outputs.size() || total != in[axis])
    Bad(n, ErrorKind::kInvalidInput, "split sizes do not add up to the axis (" + std::to_string(in[axis]) + ")");
  SliceSpec s{TensorDims(in.size(), 0), TensorDims(in.size(), 1), in};
  for (size_t p = 0; p < k; ++p) s.start[axis] += sizes[p];
  s.len[axis] = sizes[k];
  return s;
}

PadSpec ResolvePad(const Node& n, const KnownFn& known, size_t rank) {
  PadSpec p;
  bool present;
  p.pads = IntsArg(n, 1, "pads", known, &present);
  std::vector<int64_t> axes = IntsArg(n, 3, "", known, &present);  // opset 18
  if (present) {
    TensorDims full(2 * rank, 0);
    if (p.pads.size() != 2 * axes.size()) Bad(n, ErrorKind::kInvalidInput, "pads and axes differ in length");
    for (size_t k = 0; k < axes.size(); ++k) {
      const auto a = static_cast<size_t>(NormalizeAxis(n, axes[k], rank));
      full[a] = p.pads[k];
      full[rank + a] = p.pads[axes.size() + k];
    }
    p.pads = full;
  }
  if (p.pads.size() != 2 * rank)
    Bad(n, ErrorKind::kInvalidInput, std::to_string(p.pads.size()) + " pads for a rank-" + std::to_string(rank) + " tensor; expected " +
                                         std::to_string(2 * rank));
  for (int64_t v : p.pads)
    if (v > kMaxExtent || v < -kMaxExtent) Bad(n, ErrorKind::kInvalidInput, "a pad of " + std::to_string(v) + "; expected within ±2^32");
  const std::string mode = n.Str("mode", "constant");
  if (mode == "constant") {
    p.mode = PadMode::kConstant;
  } else if (mode == "reflect") {
    p.mode = PadMode::kReflect;
  } else if (mode == "edge") {
    p.mode = PadMode::kEdge;
  } else {
    Bad(n, ErrorKind::kUnsupported, "mode '" + mode + "'; expected constant, reflect or edge");
  }
  p.value = n.Float("value", 0.f);
  if (n.inputs.size() > 2 && !n.inputs[2].empty()) {
    const ConstTensor& v = Input(n, 2, known);
    if (v.numel() != 1) Bad(n, ErrorKind::kInvalidInput, "constant_value must be a scalar");
    p.value = v.data[0];
  }
  return p;
}

namespace {

// Gather along one axis (negative indices from the end).
ConstTensor FoldGather(const Node& n, const ConstTensor& x, const ConstTensor& ind) {
  if (x.dims.empty()) Bad(n, ErrorKind::kInvalidInput, "gathers from a scalar");
  const auto axis = static_cast<size_t>(NormalizeAxis(n, n.Int("axis", 0), x.dims.size()));
  TensorDims out(x.dims.begin(), x.dims.begin() + static_cast<int64_t>(axis));
  out.insert(out.end(), ind.dims.begin(), ind.dims.end());
  out.insert(out.end(), x.dims.begin() + static_cast<int64_t>(axis) + 1, x.dims.end());
  if (BoundedElements(out, kMaxFoldedElements) < 0) Bad(n, ErrorKind::kUnsupported, "gathers a constant too large to fold");
  int64_t outer = 1, inner = 1;
  for (size_t a = 0; a < axis; ++a) outer *= x.dims[a];
  for (size_t a = axis + 1; a < x.dims.size(); ++a) inner *= x.dims[a];
  const std::vector<int64_t> ids = AsInts(ind);
  std::vector<int64_t> index;  // element (o, k, i) comes from (o * d + k) * inner + i
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t id : ids) {
      const int64_t d = x.dims[axis];
      if (id < -d || id >= d) Bad(n, ErrorKind::kInvalidInput, "index " + std::to_string(id) + " outside a dim of " + std::to_string(d));
      const int64_t k = id < 0 ? id + d : id;
      for (int64_t i = 0; i < inner; ++i) index.push_back((o * d + k) * inner + i);
    }
  return Take(x, out, index);
}

// Concat of known tensors (shape lists, mostly).
ConstTensor FoldConcat(const Node& n, const ConstTensor& x, const KnownFn& known) {
  const auto axis = static_cast<size_t>(NormalizeAxis(n, n.Int("axis", 0), x.dims.size()));
  TensorDims out = x.dims;
  out[axis] = 0;
  std::vector<const ConstTensor*> parts;
  for (size_t k = 0; k < n.inputs.size(); ++k) {
    parts.push_back(&Input(n, k, known));
    if (parts.back()->dims.size() != x.dims.size()) Bad(n, ErrorKind::kInvalidInput, "inputs of different ranks");
    for (size_t a = 0; a < x.dims.size(); ++a)
      if (a != axis && parts.back()->dims[a] != x.dims[a]) Bad(n, ErrorKind::kInvalidInput, "inputs differ off the concatenation axis");
    out[axis] += parts.back()->dims[axis];
  }
  int64_t outer = 1;
  for (size_t a = 0; a < axis; ++a) outer *= out[a];
  bool ints = true;
  for (const auto* p : parts) ints = ints && p->is_int;
  ConstTensor t = Make(out, ints);
  int64_t at = 0;
  for (int64_t o = 0; o < outer; ++o)
    for (const auto* p : parts) {
      const int64_t chunk = p->numel() / std::max<int64_t>(outer, 1);
      for (int64_t i = 0; i < chunk; ++i) Set(t, at++, At(*p, o * chunk + i));
    }
  return t;
}

}  // namespace

bool FoldNode(const Node& n, const KnownFn& known, const ShapeFn& shape_of, std::vector<ConstTensor>* outs) {
  outs->clear();
  const std::string& op = n.op;
  if (op == "Shape") {
    const ConstTensor* c = n.inputs.empty() ? nullptr : known(n.inputs[0]);
    const TensorDims* d = c ? &c->dims : n.inputs.empty() ? nullptr : shape_of(n.inputs[0]);
    if (!d) return false;
    const auto r = static_cast<int64_t>(d->size());
    int64_t b = n.Int("start", 0), e = n.Int("end", r);
    b = std::clamp<int64_t>(b < 0 ? b + r : b, 0, r);
    e = std::clamp<int64_t>(e < 0 ? e + r : e, 0, r);
    std::vector<int64_t> v(d->begin() + b, d->begin() + std::max(b, e));
    outs->push_back(FromInts({static_cast<int64_t>(v.size())}, v));
    return true;
  }
  // Every other operator reads known values only.
  for (const auto& in : n.inputs)
    if (!in.empty() && !known(in)) return false;
  const ConstTensor& x = Input(n, 0, known);
  if (op == "Identity" || op == "Dropout") {
    outs->push_back(x);
  } else if (op == "Cast") {
    const int64_t to = n.Int("to", onnx::TensorProto::FLOAT);
    const bool to_int = to == onnx::TensorProto::INT64 || to == onnx::TensorProto::INT32;
    if (!to_int && to != onnx::TensorProto::FLOAT) Bad(n, ErrorKind::kUnsupported, "cast to type " + std::to_string(to));
    ConstTensor t = Make(x.dims, to_int);
    for (int64_t i = 0; i < x.numel(); ++i) Set(t, i, to_int ? std::trunc(At(x, i)) : At(x, i));
    outs->push_back(std::move(t));
  } else if (op == "Add" || op == "Sub" || op == "Mul" || op == "Div") {
    outs->push_back(Arithmetic(n, x, Input(n, 1, known)));
  } else if (op == "Gather") {
    outs->push_back(FoldGather(n, x, Input(n, 1, known)));
  } else if (op == "Concat") {
    outs->push_back(FoldConcat(n, x, known));
  } else if (op == "Reshape" || op == "Flatten" || op == "Squeeze" || op == "Unsqueeze") {
    ConstTensor t = x;
    t.dims = ReshapedDims(n, known, x.dims);
    outs->push_back(std::move(t));
  } else if (op == "Slice") {
    const SliceSpec s = ResolveSlice(n, known, x.dims);
    const TensorDims st = PlainStrides(x.dims);
    int64_t offset = 0;
    TensorDims strides(st.size());
    for (size_t a = 0; a < st.size(); ++a) {
      offset += s.start[a] * st[a];
      strides[a] = s.step[a] * st[a];
    }
    outs->push_back(Take(x, s.len, StridedIndex(offset, strides, s.len)));
  } else if (op == "ConstantOfShape") {
    std::vector<int64_t> dims = AsInts(x);
    for (int64_t d : dims)
      if (d < 0) Bad(n, ErrorKind::kInvalidInput, "a negative dim");
    ConstTensor value;
    if (n.Has("value")) value = n.attrs.at("value").t;
    if (BoundedElements(dims, kMaxFoldedElements) < 0)
      Bad(n, ErrorKind::kUnsupported, "a constant of more than " + std::to_string(kMaxFoldedElements) + " elements");
    ConstTensor t = Make(dims, value.is_int);
    for (int64_t i = 0; i < t.numel(); ++i) Set(t, i, value.numel() ? At(value, 0) : 0.0);
    outs->push_back(std::move(t));
  } else {
    return false;  // not shape arithmetic: the executor runs it on data
  }
  for (const auto& t : *outs)
    if (t.numel() > kMaxFoldedElements) Bad(n, ErrorKind::kUnsupported, "folds into a constant of " + std::to_string(t.numel()) + " elements");
  return true;
}

}  // namespace msaflow::kernels
