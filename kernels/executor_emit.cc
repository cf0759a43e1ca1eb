// A plan's oneDNN primitives emitted op by op, and the plans cached per input shape (kernels/executor_parts.h).
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
#include "kernels/half.h"
#include "kernels/tensor_ops.h"
#include "kernels/window.h"

namespace msaflow::kernels::exec {

memory::dims ToDims(const Dims& d) { return memory::dims(d.begin(), d.end()); }

// The convolution's elementwise chain and residual add. dst_scale (int8 outputs): the chain runs
// on real values, the residual is stored in the output's units (times dst_scale back to real),
// and a last step divides by dst_scale before oneDNN rounds to 8 bits.
dnnl::post_ops MakePostOps(const Executor::Op& op, float dst_scale = 1.f) {
  dnnl::post_ops po;
  std::vector<EltStep> post = op.post, post_sum = op.post_sum;
  if (dst_scale != 1.f)
    PushStep(op.sum_input.empty() ? post : post_sum, {algorithm::eltwise_linear, 1.f / dst_scale, 0.f});
  for (const auto& s : post) po.append_eltwise(1.f, s.alg, s.alpha, s.beta);
  if (!op.sum_input.empty()) {
    po.append_sum(dst_scale);
    for (const auto& s : post_sum) po.append_eltwise(1.f, s.alg, s.alpha, s.beta);
  }
  return po;
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
      : plan_(plan),
        eng_(eng),
        strm_(strm),
        g_(g),
        r_(r),
        precision_(precision),
        ranges_(ranges),
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
      const bool nonneg =
          !chain.empty() && ((chain.back().alg == algorithm::eltwise_relu && chain.back().alpha == 0.f) ||
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
          case Kind::kConv:
            EmitConv(op, src, out_dims, temps);
            break;
          case Kind::kEltwise:
            EmitEltwise(op, src, out_dims);
            break;
          case Kind::kPool:
          case Kind::kGlobalPool:
            EmitPool(op, src, out_dims);
            break;
          case Kind::kConcat:
            EmitConcat(op, out_dims);
            break;
          case Kind::kGemm:
            EmitGemm(op, src, out_dims, temps);
            break;
          case Kind::kPad:
          case Kind::kReshape:
          case Kind::kTranspose:
          case Kind::kSlice:
          case Kind::kCast:
            EmitDataMove(op, src, out_dims, temps);
            break;
          case Kind::kBinary:
          case Kind::kFold:
            break;  // above; folded by Resolve
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
    dnnl::pooling_v2_forward::desc d(
        dnnl::prop_kind::forward_inference, algorithm::pooling_avg_exclude_padding, cut.mem.get_desc(),
        memory::desc({cut.dims[0], cut.dims[1], 1, 1}, cut.mem.get_desc().data_type(), tag::any), {1, 1},
        {cut.dims[2], cut.dims[3]}, {0, 0}, {0, 0}, {0, 0});
    dnnl::pooling_v2_forward::primitive_desc pd(d, eng_);
    memory pooled = pd.dst_desc() == out.get_desc() ? out : memory(pd.dst_desc(), eng_);
    plan_.steps.push_back({dnnl::pooling_v2_forward(pd), {{DNNL_ARG_SRC, cut.mem}, {DNNL_ARG_DST, pooled}}});
    if (pooled != out)
      plan_.steps.push_back({dnnl::reorder(pooled, out), {{DNNL_ARG_FROM, pooled}, {DNNL_ARG_TO, out}}});
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
      if (b.size >= bytes &&
          (best < 0 || b.size < buffers_[static_cast<size_t>(free_list_[static_cast<size_t>(best)])].size))
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
      Throw(ErrorKind::kInvalidInput,
            "executor: int8: no calibration range for tensor '" + t + "' (ranges from another model or cut?)");
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
    memory::dims wdims =
        op.group == 1 ? ToDims(w.dims) : memory::dims{op.group, w.dims[0] / op.group, w.dims[1], w.dims[2], w.dims[3]};
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
    dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_inference, algorithm::convolution_direct, src_any, w_any,
                                      b_md, dst_any, ToDims(op.strides), dil, {op.pads[0], op.pads[1]},
                                      {op.pads[2], op.pads[3]});
    dnnl::convolution_forward::primitive_desc pd(d, attr, eng_);
    memory s;
    if (!int8 || src.mem.get_desc().data_type() == pd.src_desc().data_type()) {
      s = AsFormat(src, pd.src_desc(), &temps);
    } else {  // int8 from an f32 tensor: quantized by a reorder
      s = TempMemory(pd.src_desc(), &temps);
      dnnl::primitive_attr q;
      q.set_output_scales(0, {1.f / ScaleOf(src_name)});
      plan_.steps.push_back(
          {dnnl::reorder(dnnl::reorder::primitive_desc(src.mem, s, q)), {{DNNL_ARG_FROM, src.mem}, {DNNL_ARG_TO, s}}});
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
      if (alg == algorithm::binary_div) po.append_eltwise(1.f, algorithm::eltwise_pow, 1.f, -1.f);     // (b / a)^-1
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
      BroadcastBinary(bop, static_cast<const float*>(a.get_data_handle()), da,
                      static_cast<const float*>(b.get_data_handle()), db, out_dims,
                      static_cast<float*>(out.get_data_handle()));
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
    } else if (op.kind == Kind::kReshape || (op.kind == Kind::kCast && op.node.Int("to", 0) == kOnnxFloat)) {
      const size_t bytes = static_cast<size_t>(NumElements(x)) * sizeof(float);
      step.fn = [=] { std::memcpy(to(), from(), bytes); };
    } else if (op.kind == Kind::kCast) {  // to float16: rounded, kept as f32
      const auto count = static_cast<size_t>(NumElements(x));
      step.fn = [=] { RoundThroughHalf(from(), count, to()); };
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
    dnnl::pooling_v2_forward::desc d(dnnl::prop_kind::forward_inference, op.pool, src.mem.get_desc(), dst_any, strides,
                                     kernel, {0, 0}, pl, pr);
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

}  // namespace msaflow::kernels::exec

namespace msaflow::kernels {

Executor::Plan& Executor::PlanFor(const std::array<int64_t, 4>& shape, PlanKind kind) {
  const bool observe = kind == PlanKind::kObserve;
  auto& cache = observe ? observe_plans_ : kind == PlanKind::kMaps ? maps_plans_ : plans_;
  auto found = cache.find(shape);
  if (found != cache.end()) return *found->second;
  for (size_t i = 0; i < 4; ++i) {
    if (shape[i] <= 0) Throw(ErrorKind::kInvalidInput, "executor: input dims must be positive");
    if (graph_.input_dims[i] > 0 && graph_.input_dims[i] != shape[i])
      Throw(ErrorKind::kInvalidInput, "executor: input '" + graph_.input + "' dim " + std::to_string(i) +
                                          " is fixed at " + std::to_string(graph_.input_dims[i]) +
                                          " by the model, got " + std::to_string(shape[i]));
  }
  auto plan = std::make_unique<Plan>();
  const exec::Dims in_dims(shape.begin(), shape.end());
  const exec::Resolved r = exec::Resolve(ops_, graph_, in_dims);
  const std::map<std::string, exec::Dims>& shapes = r.shapes;
  std::vector<Op> ops = exec::FuseEltwise(exec::FoldResidualAdds(r.ops, shapes, r.outputs()), r.outputs());
  // Last use of each tensor, to return buffers to the pool.
  std::map<std::string, size_t> last_use;
  for (size_t i = 0; i < ops.size(); ++i) {
    for (const auto& in : ops[i].inputs) last_use[in] = i;
    if (!ops[i].sum_input.empty()) last_use[ops[i].sum_input] = i;
  }
  for (const auto& o : r.outputs()) last_use[o] = ops.size();  // pooled after the last op

  exec::PlanBuilder b(*plan, engine_->eng, engine_->strm, graph_, r, observe ? Precision::kF32 : precision_, ranges_);
  b.Input(in_dims);
  b.ChooseInt8Types(ops);
  for (size_t i = 0; i < ops.size(); ++i) b.Emit(ops[i], i, shapes.at(ops[i].output), last_use, observe);
  b.Output(kind == PlanKind::kMaps);
  Plan& ref = *plan;
  cache[shape] = std::move(plan);
  return ref;
}

}  // namespace msaflow::kernels
