#include "kernels/tail_ops.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <oneapi/dnnl/dnnl.hpp>
#include <optional>
#include <set>
#include <type_traits>

#include "common/error.h"
#include "kernels/fold.h"
#include "kernels/gemm.h"
#include "kernels/window.h"

namespace msaflow::kernels {

namespace {

using dnnl::algorithm;
using dnnl::memory;
using dnnl::prop_kind;
using tag = memory::format_tag;
using dt = memory::data_type;

// One engine and stream per thread (a Tail is used by one thread at a time).
struct Dnnl {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream strm{eng};
};
Dnnl& Ctx() {
  thread_local Dnnl ctx;
  return ctx;
}

[[noreturn]] void Fail(const Node& n, ErrorKind kind, const std::string& what) {
  Throw(kind, "node '" + n.name + "' (" + n.op + "): " + what);
}

std::string BracketedDims(const TensorDims& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? "," : "") + std::to_string(d[i]);
  return s + "]";
}

memory::dims ToDnnl(const TensorDims& d) { return memory::dims(d.begin(), d.end()); }

// A memory over `data` of dims d (ONNX order): channels-last (acdb) with `cl`, else row-major.
memory Mem(const TensorDims& d, const float* data, bool cl = false) {
  const tag t = d.size() == 4   ? (cl ? tag::acdb : tag::abcd)
                : d.size() == 5 ? tag::abcde
                : d.size() == 2 ? tag::ab
                                : tag::a;
  return memory(memory::desc(ToDnnl(d), dt::f32, t), Ctx().eng, const_cast<float*>(data));
}

// `user` in the layout `want`: itself where the layouts agree, else reordered into *buf.
memory As(const memory& user, const memory::desc& want, memory* buf) {
  if (user.get_desc() == want) return user;
  if (!*buf || buf->get_desc() != want) *buf = memory(want, Ctx().eng);
  dnnl::reorder(user, *buf).execute(Ctx().strm, const_cast<memory&>(user), *buf);
  return *buf;
}

// A buffer of at least n floats, kept from call to call (a fresh one faults its pages in: for
// the tensors of a batch, that cost more than the arithmetic), one per thread and use, shared by
// every tail's ops on the thread (they run one at a time; TailOp::Scratches): kAdd for a gradient
// to add into one already written, kGrad for the gradient before a fused activation (a backward
// pass may need both at once). Its contents are the caller's until the next call for that use.
enum ScratchFor { kAdd, kGrad };
std::vector<float>& ScratchFloats(size_t n, ScratchFor use = kAdd) {
  thread_local std::array<std::vector<float>, 2> bufs;
  std::vector<float>& buf = bufs[use];
  if (buf.size() < n) buf.resize(n);
  return buf;
}

// grad[i] += part[i] for the first n values (all of part's by default).
void AddInto(std::vector<float>* grad, const std::vector<float>& part, size_t n = SIZE_MAX) {
  n = std::min(n, part.size());
  float* g = grad->data();
  const float* p = part.data();
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) g[i] += p[i];
}

// Writes `from` (layout of its own) into the gradient g (dims d, channels-last with `cl`):
// directly, or through a scratch added to it when `add`.
void Deliver(const memory& from, const TensorDims& d, bool cl, const GradOut& g) {
  g.t->dims = d;
  g.t->cl = cl;
  const size_t n = static_cast<size_t>(NumElements(d));
  if (!g.add) {
    g.t->v.resize(n);
    memory to = Mem(d, g.t->v.data(), cl);
    if (from.get_desc() == to.get_desc()) {
      std::memcpy(g.t->v.data(), from.get_data_handle(), n * sizeof(float));
    } else {
      dnnl::reorder(from, to).execute(Ctx().strm, const_cast<memory&>(from), to);
      Ctx().strm.wait();
    }
    return;
  }
  std::vector<float>& tmp = ScratchFloats(n);
  memory to = Mem(d, tmp.data(), cl);
  dnnl::reorder(from, to).execute(Ctx().strm, const_cast<memory&>(from), to);
  Ctx().strm.wait();
  AddInto(&g.t->v, tmp, n);
}

// Writes or adds (GradOut::add) one gradient value.
inline void Put(float* dst, size_t i, float v, bool add) { dst[i] = add ? dst[i] + v : v; }

// Sizes the gradient of input `x` (its dims and layout; keeping what an earlier consumer wrote).
float* Prepare(const GradOut& g, const Act& x) {
  if (!g.add) {
    g.t->dims = x.dims;
    g.t->cl = x.cl;
    g.t->v.resize(x.v.size());
  }
  return g.t->v.data();
}

// Image tensors must come channels-last (every 4-D tensor the tail computes does).
void NeedChannelsLast(const Node& n, const Act& a) {
  if (a.dims.size() != 4 || !a.cl)
    Fail(n, ErrorKind::kInvalidInput, "expected an NCHW image tensor, got " + BracketedDims(a.dims));
}

// ---- Convolution --------------------------------------------------------------------------

class ConvOp : public TailOp {
 public:
  ConvOp(const Node& n, WeightRef w, WeightRef b) : node_(n), w_(std::move(w)), b_(std::move(b)) {
    if (!w_.value) Fail(n, ErrorKind::kUnsupported, "expected inputs X, W[, B] with W a constant");
    if (w_.dims.size() != 4) Fail(n, ErrorKind::kUnsupported, "only 2-D convolutions (4-D weights) train");
    group_ = n.Int("group", 1);
    if (group_ < 1 || w_.dims[0] % group_ != 0) Fail(n, ErrorKind::kUnsupported, "invalid group count");
    if (n.Has("strides")) strides_ = n.Ints("strides");
    if (n.Has("dilations")) dilations_ = n.Ints("dilations");
    if (n.Has("pads")) pads_ = n.Ints("pads");
    auto_pad_ = n.Str("auto_pad", "NOTSET");
    if (strides_.size() != 2 || dilations_.size() != 2 || pads_.size() != 4)
      Fail(n, ErrorKind::kUnsupported, "expected 2-D strides and dilations and 4 pads");
    for (int64_t v : strides_)
      if (v < 1) Fail(n, ErrorKind::kUnsupported, "strides must be at least 1");
    for (int64_t v : dilations_)
      if (v < 1) Fail(n, ErrorKind::kUnsupported, "dilations must be at least 1");
    zero_bias_.assign(static_cast<size_t>(w_.dims[0]), 0.f);
  }

  // The gradient before a fused activation (ScratchFloats kGrad); the input's gradient added through
  // ScratchFloats kAdd (a 1 x 1 convolution's product adds it in place).
  ScratchUse Scratches() const override { return {act_ ? NumElements(out_dims_) : 0, added_}; }

  bool Fuse(const Activation& a) override {
    act_ = a;
    in_dims_.clear();  // the forward primitive is made again, with the activation
    return true;
  }

  void Forward(const std::vector<const Act*>& in, Act* out) override {
    NeedChannelsLast(node_, *in[0]);
    const TensorDims& x = in[0]->dims;
    Compile(x);
    out->dims = out_dims_;
    out->cl = true;
    out->v.resize(static_cast<size_t>(NumElements(out_dims_)));
    if (pointwise_) {
      PointwiseForward(*in[0], out);
      return;
    }
    src_user_ = Mem(x, in[0]->v.data(), true);
    src_ = As(src_user_, fwd_.src_desc(), &src_blk_);
    memory w = As(Mem(WeightDims(), w_.value->data()), fwd_.weights_desc(), &w_blk_);
    memory b = Mem({w_.dims[0]}, b_.value ? b_.value->data() : zero_bias_.data());
    memory dst_user = Mem(out_dims_, out->v.data(), true);
    memory dst = fwd_.dst_desc() == dst_user.get_desc() ? dst_user : Scratch(fwd_.dst_desc(), &dst_blk_);
    dnnl::convolution_forward(fwd_).execute(
        Ctx().strm, {{DNNL_ARG_SRC, src_}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_BIAS, b}, {DNNL_ARG_DST, dst}});
    if (dst != dst_user) dnnl::reorder(dst, dst_user).execute(Ctx().strm, dst, dst_user);
    Ctx().strm.wait();
    if (act_ && !post_op_) Activate(out->v.data(), static_cast<int64_t>(out->v.size()));
  }

  void Backward(const std::vector<const Act*>& in, const Act& out, const Act& dout,
                const std::vector<GradOut>& din) override {
    if (pointwise_) {
      PointwiseBackward(*in[0], out, dout, din[0]);
      return;
    }
    const float* dy = dout.v.data();
    if (act_) {  // the gradient before the activation
      float* dz = ScratchFloats(dout.v.size(), kGrad).data();
      ActivationGrad(out.v.data(), dy, dz, static_cast<int64_t>(dout.v.size()));
      dy = dz;
    }
    memory dd_user = Mem(out_dims_, dy, true);
    memory dd_data;  // dout in the data pass's layout, when that pass runs
    if (din[0].t) {
      memory dd = dd_data = As(dd_user, bwd_data_.diff_dst_desc(), &dd_blk_);
      memory w = As(Mem(WeightDims(), w_.value->data()), bwd_data_.weights_desc(), &w_blk_bwd_);
      memory ds = Scratch(bwd_data_.diff_src_desc(), &ds_blk_);
      dnnl::convolution_backward_data(bwd_data_).execute(
          Ctx().strm, {{DNNL_ARG_DIFF_DST, dd}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_DIFF_SRC, ds}});
      Ctx().strm.wait();
      Deliver(ds, in[0]->dims, true, din[0]);
      added_ = din[0].add ? NumElements(in[0]->dims) : 0;
    }
    if (!w_.grad && !b_.grad) return;
    memory src = src_.get_desc() == bwd_w_.src_desc() ? src_ : As(src_user_, bwd_w_.src_desc(), &src_blk_w_);
    memory dd = dd_data && dd_data.get_desc() == bwd_w_.diff_dst_desc()
                    ? dd_data
                    : As(dd_user, bwd_w_.diff_dst_desc(), &dd_blk_w_);
    memory dw = Scratch(bwd_w_.diff_weights_desc(), &dw_blk_);
    std::vector<float> db(static_cast<size_t>(w_.dims[0]));
    memory db_mem = Mem({w_.dims[0]}, db.data());
    dnnl::convolution_backward_weights(bwd_w_).execute(
        Ctx().strm,
        {{DNNL_ARG_SRC, src}, {DNNL_ARG_DIFF_DST, dd}, {DNNL_ARG_DIFF_WEIGHTS, dw}, {DNNL_ARG_DIFF_BIAS, db_mem}});
    Ctx().strm.wait();
    if (w_.grad) {
      Act part;
      Deliver(dw, WeightDims(), false, {&part, false});
      AddInto(w_.grad, part.v);
    }
    if (b_.grad) AddInto(b_.grad, db);
  }

 private:
  // A 1 x 1 convolution of stride 1 without padding on a channels-last tensor is one matrix
  // product over the pixels: Y [pixels x O] = X [pixels x I] W^T (W is O x I), and its backward
  // passes are two more, on oneDNN's sgemm (kernels/gemm.h): measured faster than oneDNN's
  // 1 x 1 convolution primitives on these shapes, its backward_weights above all.
  // With an activation, the pixels go in blocks of about 256 KiB of output, the threads taking
  // blocks (each block's product on one thread): a block is activated, and in the backward pass
  // its gradient masked and multiplied on, while it is in the core's cache.
  void PointwiseForward(const Act& x, Act* out) const {
    const int64_t m = NumElements(x.dims) / x.dims[1], i = w_.dims[1], o = w_.dims[0];
    const float *b = b_.value ? b_.value->data() : zero_bias_.data(), *w = w_.value->data();
    if (!act_) {
      for (int64_t r = 0; r < m; ++r)
        std::memcpy(&out->v[static_cast<size_t>(r * o)], b, static_cast<size_t>(o) * sizeof(float));
      Gemm(false, true, m, o, i, 1.f, x.v.data(), i, w, i, 1.f, out->v.data(), o);
      return;
    }
    InBlocks(m, o, [&](int64_t r0, int64_t rows) {
      float* y = &out->v[static_cast<size_t>(r0 * o)];
      for (int64_t r = 0; r < rows; ++r) std::memcpy(y + r * o, b, static_cast<size_t>(o) * sizeof(float));
      Gemm(false, true, rows, o, i, 1.f, x.v.data() + r0 * i, i, w, i, 1.f, y, o);
      Activate(y, rows * o);
    });
  }
  void PointwiseBackward(const Act& x, const Act& out, const Act& dout, const GradOut& dx) {
    const int64_t m = NumElements(x.dims) / x.dims[1], i = w_.dims[1], o = w_.dims[0];
    const float* dy = dout.v.data();
    float* g = dx.t ? Prepare(dx, x) : nullptr;
    const float beta = dx.add ? 1.f : 0.f;
    if (act_) {
      float* dz = ScratchFloats(dout.v.size(), kGrad).data();  // this thread's, taken before the threads start
      InBlocks(m, o, [&](int64_t r0, int64_t rows) {
        ActivationGrad(out.v.data() + r0 * o, dy + r0 * o, dz + r0 * o, rows * o);
      });
      dy = dz;
    }
    if (g) Gemm(false, false, m, i, o, 1.f, dy, o, w_.value->data(), i, beta, g, i);
    if (w_.grad) Gemm(true, false, o, i, m, 1.f, dy, o, x.v.data(), i, 1.f, w_.grad->data(), i);
    if (b_.grad) AddColumnSums(dy, m, o, o, b_.grad->data());
  }

  // f(first row, rows) over blocks of the m x o output's rows, in parallel. Each block's Gemm
  // runs on its thread alone (oneDNN's sgemm does not start threads inside a parallel region),
  // and the blocks do not depend on the thread count: the results neither.
  template <class F>
  static void InBlocks(int64_t m, int64_t o, F f) {
    const int64_t rows = std::max<int64_t>(16, (int64_t{256} << 10) / (o * static_cast<int64_t>(sizeof(float))));
    const int64_t blocks = (m + rows - 1) / rows;
    std::exception_ptr error;
#pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < blocks; ++k) {
      try {
        f(k * rows, std::min(rows, m - k * rows));
      } catch (...) {
#pragma omp critical(msaflow_tail_blocks)
        error = std::current_exception();
      }
    }
    if (error) std::rethrow_exception(error);
  }

  void Activate(float* y, int64_t n) const {
    const float lo = act_->lo, hi = act_->hi;
#pragma omp simd
    for (int64_t k = 0; k < n; ++k) y[k] = std::min(std::max(y[k], lo), hi);
  }
  void ActivationGrad(const float* y, const float* dy, float* dz, int64_t n) const {
    const float lo = act_->lo, hi = act_->hi;
#pragma omp simd
    for (int64_t k = 0; k < n; ++k) dz[k] = static_cast<float>((y[k] > lo) & (y[k] < hi)) * dy[k];  // no branch
  }

  TensorDims WeightDims() const {
    const TensorDims& w = w_.dims;
    if (group_ == 1) return w;
    return {group_, w[0] / group_, w[1], w[2], w[3]};
  }

  static memory Scratch(const memory::desc& md, memory* buf) {
    if (!*buf || buf->get_desc() != md) *buf = memory(md, Ctx().eng);
    return *buf;
  }

  void Compile(const TensorDims& x) {
    if (x == in_dims_) return;
    const TensorDims& w = w_.dims;
    if (x.size() != 4) Fail(node_, ErrorKind::kInvalidInput, "expected an NCHW input, got " + BracketedDims(x));
    if (x[1] != w[1] * group_)
      Fail(node_, ErrorKind::kInvalidInput,
           "input has " + std::to_string(x[1]) + " channels, weights expect " + std::to_string(w[1] * group_));
    TensorDims out{x[0], w[0], 0, 0};
    memory::dims pl(2), pr(2), st(2), dil(2);
    for (int a = 0; a < 2; ++a) {
      int64_t pb, pe;
      SpatialOut(auto_pad_, x[2 + a], w[2 + a], strides_[a], dilations_[a], pads_[a], pads_[2 + a], &out[2 + a], &pb,
                 &pe);
      if (out[2 + a] < 1)
        Fail(node_, ErrorKind::kInvalidInput, "the window does not fit the input " + BracketedDims(x));
      pl[a] = pb;
      pr[a] = pe;
      st[a] = strides_[a];
      dil[a] = dilations_[a] - 1;
    }
    in_dims_ = x;
    out_dims_ = out;
    pointwise_ = group_ == 1 && w[2] == 1 && w[3] == 1 && st == memory::dims{1, 1} && pl == memory::dims{0, 0} &&
                 pr == memory::dims{0, 0};
    if (pointwise_) return;
    // Activations channels-last, as they are kept between operators (oneDNN's jit kernels take
    // them so: no reorder of an activation); weights in the layout oneDNN prefers.
    memory::desc src_any(ToDnnl(x), dt::f32, tag::acdb), dst_any(ToDnnl(out), dt::f32, tag::acdb);
    memory::desc w_any(ToDnnl(WeightDims()), dt::f32, tag::any), b_md({w[0]}, dt::f32, tag::a);
    const auto alg = algorithm::convolution_direct;
    dnnl::convolution_forward::desc fd(prop_kind::forward_training, alg, src_any, w_any, b_md, dst_any, st, dil, pl,
                                       pr);
    // The activation as oneDNN's post-op where its kernels take one, else a pass after.
    post_op_ = false;
    if (act_) {
      dnnl::post_ops ops;
      if (act_->lo == 0.f && std::isinf(act_->hi))
        ops.append_eltwise(1.f, algorithm::eltwise_relu, 0.f, 0.f);
      else
        ops.append_eltwise(1.f, algorithm::eltwise_clip, act_->lo, act_->hi);
      dnnl::primitive_attr attr;
      attr.set_post_ops(ops);
      try {
        fwd_ = dnnl::convolution_forward::primitive_desc(fd, attr, Ctx().eng);
        post_op_ = true;
      } catch (const dnnl::error&) {
        post_op_ = false;
      }
    }
    if (!post_op_) fwd_ = dnnl::convolution_forward::primitive_desc(fd, Ctx().eng);
    dnnl::convolution_backward_data::desc bd(alg, src_any, w_any, dst_any, st, dil, pl, pr);
    bwd_data_ = dnnl::convolution_backward_data::primitive_desc(bd, Ctx().eng, fwd_);
    dnnl::convolution_backward_weights::desc wd(alg, src_any, w_any, b_md, dst_any, st, dil, pl, pr);
    bwd_w_ = dnnl::convolution_backward_weights::primitive_desc(wd, Ctx().eng, fwd_);
    in_dims_ = x;
    out_dims_ = out;
  }

  Node node_;
  bool pointwise_ = false;
  std::optional<Activation> act_;  // fused (Fuse)
  int64_t added_ = 0;              // the last Backward's ScratchFloats kAdd
  bool post_op_ = false;           // ... and applied by oneDNN's kernel
  WeightRef w_, b_;
  int64_t group_ = 1;
  TensorDims strides_{1, 1}, dilations_{1, 1}, pads_{0, 0, 0, 0};
  std::string auto_pad_;
  std::vector<float> zero_bias_;
  TensorDims in_dims_, out_dims_;
  dnnl::convolution_forward::primitive_desc fwd_;
  dnnl::convolution_backward_data::primitive_desc bwd_data_;
  dnnl::convolution_backward_weights::primitive_desc bwd_w_;
  memory src_user_, src_, src_blk_, w_blk_, dst_blk_, dd_blk_, w_blk_bwd_, ds_blk_, src_blk_w_, dd_blk_w_, dw_blk_;
};

// ---- Pooling --------------------------------------------------------------------------------

class PoolOp : public TailOp {
 public:
  explicit PoolOp(const Node& n) : node_(n) {
    kernel_ = n.Ints("kernel_shape");
    if (kernel_.size() != 2) Fail(n, ErrorKind::kUnsupported, "expected a 2-D kernel_shape");
    if (n.Has("strides")) strides_ = n.Ints("strides");
    if (n.Has("pads")) pads_ = n.Ints("pads");
    if (n.Has("dilations") && n.Ints("dilations") != TensorDims{1, 1})
      Fail(n, ErrorKind::kUnsupported, "dilated pooling");
    if (strides_.size() != 2 || pads_.size() != 4) Fail(n, ErrorKind::kUnsupported, "expected 2-D strides and 4 pads");
    if (n.outputs.size() > 1 && !n.outputs[1].empty()) Fail(n, ErrorKind::kUnsupported, "MaxPool's indices output");
    auto_pad_ = n.Str("auto_pad", "NOTSET");
    ceil_ = n.Int("ceil_mode", 0) != 0;
    include_pad_ = n.op == "AveragePool" && n.Int("count_include_pad", 0) != 0;
    alg_ = n.op == "MaxPool" ? algorithm::pooling_max
           : include_pad_    ? algorithm::pooling_avg_include_padding
                             : algorithm::pooling_avg_exclude_padding;
  }

  void Forward(const std::vector<const Act*>& in, Act* out) override {
    NeedChannelsLast(node_, *in[0]);
    Compile(in[0]->dims);
    out->dims = out_dims_;
    out->cl = true;
    out->v.resize(static_cast<size_t>(NumElements(out_dims_)));
    memory src = Mem(in[0]->dims, in[0]->v.data(), true), dst = Mem(out_dims_, out->v.data(), true);
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, dst}};
    if (alg_ == algorithm::pooling_max) args[DNNL_ARG_WORKSPACE] = ws_;
    dnnl::pooling_v2_forward(fwd_).execute(Ctx().strm, args);
    Ctx().strm.wait();
  }

  void Backward(const std::vector<const Act*>& in, const Act&, const Act& dout,
                const std::vector<GradOut>& din) override {
    if (!din[0].t) return;
    const size_t n = in[0]->v.size();
    float* dst = din[0].add ? ScratchFloats(n).data() : Prepare(din[0], *in[0]);
    memory dd = Mem(out_dims_, dout.v.data(), true), ds = Mem(in[0]->dims, dst, true);
    std::unordered_map<int, memory> args{{DNNL_ARG_DIFF_DST, dd}, {DNNL_ARG_DIFF_SRC, ds}};
    if (alg_ == algorithm::pooling_max) args[DNNL_ARG_WORKSPACE] = ws_;
    dnnl::pooling_v2_backward(bwd_).execute(Ctx().strm, args);
    Ctx().strm.wait();
    if (din[0].add) AddInto(&din[0].t->v, ScratchFloats(n), n);
    added_ = din[0].add ? static_cast<int64_t>(n) : 0;
  }

  ScratchUse Scratches() const override { return {0, added_}; }

 private:
  void Compile(const TensorDims& x) {
    if (x == in_dims_) return;
    if (x.size() != 4) Fail(node_, ErrorKind::kInvalidInput, "expected an NCHW input, got " + BracketedDims(x));
    TensorDims out{x[0], x[1], 0, 0};
    memory::dims pl(2), pr(2);
    for (int a = 0; a < 2; ++a) {
      int64_t pb, pe;
      SpatialOut(auto_pad_, x[2 + a], kernel_[a], strides_[a], 1, pads_[a], pads_[2 + a], &out[2 + a], &pb, &pe, ceil_);
      if (out[2 + a] < 1)
        Fail(node_, ErrorKind::kInvalidInput, "the window does not fit the input " + BracketedDims(x));
      if (include_pad_ && pe != pads_[2 + a])
        Fail(node_, ErrorKind::kUnsupported, "count_include_pad=1 with a ceil_mode window over the end");
      pl[a] = pb;
      pr[a] = pe;
    }
    memory::desc src(ToDnnl(x), dt::f32, tag::acdb), dst(ToDnnl(out), dt::f32, tag::acdb);
    const memory::dims st{strides_[0], strides_[1]}, k{kernel_[0], kernel_[1]}, dil{0, 0};
    dnnl::pooling_v2_forward::desc fd(prop_kind::forward_training, alg_, src, dst, st, k, dil, pl, pr);
    fwd_ = dnnl::pooling_v2_forward::primitive_desc(fd, Ctx().eng);
    dnnl::pooling_v2_backward::desc bd(alg_, src, dst, st, k, dil, pl, pr);
    bwd_ = dnnl::pooling_v2_backward::primitive_desc(bd, Ctx().eng, fwd_);
    if (alg_ == algorithm::pooling_max) ws_ = memory(fwd_.workspace_desc(), Ctx().eng);
    in_dims_ = x;
    out_dims_ = out;
  }

  Node node_;
  TensorDims kernel_, strides_{1, 1}, pads_{0, 0, 0, 0};
  std::string auto_pad_;
  bool ceil_ = false, include_pad_ = false;
  algorithm alg_;
  TensorDims in_dims_, out_dims_;
  dnnl::pooling_v2_forward::primitive_desc fwd_;
  dnnl::pooling_v2_backward::primitive_desc bwd_;
  memory ws_;
  int64_t added_ = 0;  // the last Backward's ScratchFloats kAdd
};

// ---- Elementwise ----------------------------------------------------------------------------

enum class Unary { kRelu, kClip, kSigmoid, kHardSigmoid, kHardSwish, kIdentity };

// y = F(x) and dy/dx at x (y = F(x)), per kind; at the kinks the convention of PyTorch's backward
// formulas (relu, hardtanh, hardsigmoid pass no gradient at their bounds; hardswish takes the
// inner slope at 3). Templates, so that each kind's loop is its own and vectorises.
template <Unary K>
inline float UnaryF(float x, float a, float b) {
  if constexpr (K == Unary::kRelu) return x > 0 ? x : 0.f;
  if constexpr (K == Unary::kClip) return std::min(std::max(x, a), b);
  if constexpr (K == Unary::kSigmoid) return 1.f / (1.f + std::exp(-x));
  if constexpr (K == Unary::kHardSigmoid) return std::min(std::max(a * x + b, 0.f), 1.f);
  if constexpr (K == Unary::kHardSwish) return x * std::min(std::max(x / 6.f + 0.5f, 0.f), 1.f);
  return x;
}
template <Unary K>
inline float UnaryD(float x, float y, float a, float b) {
  if constexpr (K == Unary::kRelu) return x > 0 ? 1.f : 0.f;
  if constexpr (K == Unary::kClip) return x > a && x < b ? 1.f : 0.f;
  if constexpr (K == Unary::kSigmoid) return y * (1.f - y);
  if constexpr (K == Unary::kHardSigmoid) {
    const float t = a * x + b;
    return t > 0 && t < 1 ? a : 0.f;
  }
  if constexpr (K == Unary::kHardSwish) return x < -3.f ? 0.f : x <= 3.f ? x / 3.f + 0.5f : 1.f;
  return 1.f;
}

template <Unary K>
void UnaryForward(const float* x, float* y, int64_t n, float a, float b) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = UnaryF<K>(x[i], a, b);
}
// ReLU and Clip pass a gradient or none: their backward pass reads a byte per value, kept by
// the forward pass, not the four bytes of the input (cold by then: on these machines the
// backward pass of a ReLU6 was measured memory-bound, five times its forward pass).
template <Unary K>
void MaskForward(const float* x, float* y, uint8_t* mask, int64_t n, float a, float b) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    y[i] = UnaryF<K>(x[i], a, b);
    mask[i] = static_cast<uint8_t>(UnaryD<K>(x[i], 0.f, a, b));
  }
}
template <bool kAdd>
void MaskBackward(const uint8_t* mask, const float* dy, float* dx, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float g = dy[i] * static_cast<float>(mask[i]);
    dx[i] = kAdd ? dx[i] + g : g;
  }
}
template <Unary K, bool kAdd>
void UnaryBackward(const float* x, const float* y, const float* dy, float* dx, int64_t n, float a, float b) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float g = dy[i] * UnaryD<K>(x[i], y[i], a, b);
    dx[i] = kAdd ? dx[i] + g : g;
  }
}

class UnaryOp : public TailOp {
 public:
  UnaryOp(Unary kind, float a, float b) : kind_(kind), a_(a), b_(b) {}

  void Forward(const std::vector<const Act*>& in, Act* out) override {
    const Act& x = *in[0];
    out->dims = x.dims;
    out->cl = x.cl;
    out->v.resize(x.v.size());
    if (Masked()) {
      mask_.resize(x.v.size());
      if (kind_ == Unary::kRelu)
        MaskForward<Unary::kRelu>(x.v.data(), out->v.data(), mask_.data(), Size(x), a_, b_);
      else
        MaskForward<Unary::kClip>(x.v.data(), out->v.data(), mask_.data(), Size(x), a_, b_);
      return;
    }
    Dispatch([&](auto k) { UnaryForward<decltype(k)::value>(x.v.data(), out->v.data(), Size(x), a_, b_); });
  }

  void Backward(const std::vector<const Act*>& in, const Act& out, const Act& dout,
                const std::vector<GradOut>& din) override {
    if (!din[0].t) return;
    const float *xs = in[0]->v.data(), *ys = out.v.data(), *dy = dout.v.data();
    const bool add = din[0].add;
    float* dx = Prepare(din[0], *in[0]);
    const int64_t n = Size(*in[0]);
    if (Masked()) {
      if (add)
        MaskBackward<true>(mask_.data(), dy, dx, n);
      else
        MaskBackward<false>(mask_.data(), dy, dx, n);
      return;
    }
    Dispatch([&](auto k) {
      constexpr Unary K = decltype(k)::value;
      if (add)
        UnaryBackward<K, true>(xs, ys, dy, dx, n, a_, b_);
      else
        UnaryBackward<K, false>(xs, ys, dy, dx, n, a_, b_);
    });
  }

 private:
  bool Masked() const { return kind_ == Unary::kRelu || kind_ == Unary::kClip; }
  static int64_t Size(const Act& a) { return static_cast<int64_t>(a.v.size()); }
  template <class F>
  void Dispatch(F f) const {
    switch (kind_) {
      case Unary::kRelu:
        return f(std::integral_constant<Unary, Unary::kRelu>{});
      case Unary::kClip:
        return f(std::integral_constant<Unary, Unary::kClip>{});
      case Unary::kSigmoid:
        return f(std::integral_constant<Unary, Unary::kSigmoid>{});
      case Unary::kHardSigmoid:
        return f(std::integral_constant<Unary, Unary::kHardSigmoid>{});
      case Unary::kHardSwish:
        return f(std::integral_constant<Unary, Unary::kHardSwish>{});
      case Unary::kIdentity:
        return f(std::integral_constant<Unary, Unary::kIdentity>{});
    }
  }

  Unary kind_;
  float a_, b_;
  std::vector<uint8_t> mask_;
};

// A scalar constant input (Clip's min and max in opset 11 and later), else the default.
float ScalarOr(const Graph& g, const Node& n, size_t i, float dflt) {
  if (n.inputs.size() <= i || n.inputs[i].empty()) return dflt;
  auto it = g.consts.find(n.inputs[i]);
  if (it == g.consts.end() || it->second.numel() != 1)
    Fail(n, ErrorKind::kUnsupported, "min and max must be scalar constants");
  return it->second.data[0];
}

// Clip's bounds: attributes (opset < 11) or scalar constant inputs, unbounded where absent.
Activation ClipBounds(const Graph& g, const Node& n) {
  return {ScalarOr(g, n, 1, n.Float("min", -std::numeric_limits<float>::max())),
          ScalarOr(g, n, 2, n.Float("max", std::numeric_limits<float>::max()))};
}

std::unique_ptr<TailOp> MakeUnary(const Graph& g, const Node& n) {
  const std::string& t = n.op;
  if (t == "Relu") return std::make_unique<UnaryOp>(Unary::kRelu, 0.f, 0.f);
  if (t == "Sigmoid") return std::make_unique<UnaryOp>(Unary::kSigmoid, 0.f, 0.f);
  if (t == "HardSigmoid")
    return std::make_unique<UnaryOp>(Unary::kHardSigmoid, n.Float("alpha", 0.2f), n.Float("beta", 0.5f));
  if (t == "HardSwish") return std::make_unique<UnaryOp>(Unary::kHardSwish, 0.f, 0.f);
  if (t == "Identity" || t == "Dropout") {
    if (n.outputs.size() > 1 && !n.outputs[1].empty()) Fail(n, ErrorKind::kUnsupported, "Dropout's mask output");
    return std::make_unique<UnaryOp>(Unary::kIdentity, 0.f, 0.f);
  }
  const Activation clip = ClipBounds(g, n);
  return std::make_unique<UnaryOp>(Unary::kClip, clip.lo, clip.hi);
}

// ---- BatchNormalization (inference statistics; scale and shift train) ---------------------

// The layout of a tensor with channels: `outer` blocks of `channels` runs of `inner` values
// (NCHW: N, C, H*W; channels-last: N*H*W, C, 1).
struct ChannelLayout {
  int64_t outer, channels, inner;
};
ChannelLayout LayoutOf(const Act& a) {
  const int64_t n = a.dims[0], c = a.dims[1], rest = NumElements(a.dims) / std::max<int64_t>(n * c, 1);
  return a.cl ? ChannelLayout{n * rest, c, 1} : ChannelLayout{n, c, rest};
}

class BatchNormOp : public TailOp {
 public:
  BatchNormOp(const Node& n, WeightRef scale, WeightRef shift, const Graph& g)
      : node_(n), scale_(std::move(scale)), shift_(std::move(shift)) {
    auto stat = [&](size_t i) {
      auto it = n.inputs.size() > i ? g.consts.find(n.inputs[i]) : g.consts.end();
      if (it == g.consts.end()) Fail(n, ErrorKind::kUnsupported, "mean and variance must be constants");
      return it->second.data;
    };
    if (!scale_.value || !shift_.value) Fail(n, ErrorKind::kUnsupported, "scale and B must be constants");
    mean_ = stat(3);
    const std::vector<float> var = stat(4);
    const float eps = n.Float("epsilon", 1e-5f);
    inv_std_.resize(var.size());
    for (size_t c = 0; c < var.size(); ++c) inv_std_[c] = 1.f / std::sqrt(var[c] + eps);
    if (n.outputs.size() > 1) Fail(n, ErrorKind::kUnsupported, "training-mode outputs (running statistics)");
  }

  void Forward(const std::vector<const Act*>& in, Act* out) override {
    const Act& x = *in[0];
    Check(x.dims);
    out->dims = x.dims;
    out->cl = x.cl;
    out->v.resize(x.v.size());
    const ChannelLayout l = LayoutOf(x);
    std::vector<float> mul(static_cast<size_t>(l.channels)), add(mul.size());
    for (size_t k = 0; k < mul.size(); ++k) {
      mul[k] = (*scale_.value)[k] * inv_std_[k];
      add[k] = (*shift_.value)[k] - mean_[k] * mul[k];
    }
#pragma omp parallel for schedule(static)
    for (int64_t o = 0; o < l.outer; ++o)
      for (int64_t k = 0; k < l.channels; ++k)
        for (int64_t j = 0; j < l.inner; ++j) {
          const size_t p = static_cast<size_t>((o * l.channels + k) * l.inner + j);
          out->v[p] = x.v[p] * mul[static_cast<size_t>(k)] + add[static_cast<size_t>(k)];
        }
  }

  void Backward(const std::vector<const Act*>& in, const Act&, const Act& dout,
                const std::vector<GradOut>& din) override {
    const Act& x = *in[0];
    const ChannelLayout l = LayoutOf(x);
    const size_t C = static_cast<size_t>(l.channels);
    float* dx = din[0].t ? Prepare(din[0], x) : nullptr;
    const bool add = din[0].add;
    std::vector<float> mul(C);
    for (size_t k = 0; k < C; ++k) mul[k] = (*scale_.value)[k] * inv_std_[k];
    // Per-channel sums over the blocks, each thread its own, added in thread order.
    std::vector<std::vector<double>> parts;
#pragma omp parallel
    {
#pragma omp single
      parts.assign(static_cast<size_t>(omp_get_num_threads()), std::vector<double>(2 * C, 0.0));
      std::vector<double>& mine = parts[static_cast<size_t>(omp_get_thread_num())];
#pragma omp for schedule(static)
      for (int64_t o = 0; o < l.outer; ++o)
        for (size_t k = 0; k < C; ++k)
          for (int64_t j = 0; j < l.inner; ++j) {
            const size_t p = (static_cast<size_t>(o) * C + k) * static_cast<size_t>(l.inner) + static_cast<size_t>(j);
            const float g = dout.v[p];
            mine[k] += static_cast<double>(g) * (x.v[p] - mean_[k]) * inv_std_[k];
            mine[C + k] += g;
            if (dx) Put(dx, p, g * mul[k], add);
          }
    }
    for (const auto& part : parts)
      for (size_t k = 0; k < C; ++k) {
        if (scale_.grad) (*scale_.grad)[k] += static_cast<float>(part[k]);
        if (shift_.grad) (*shift_.grad)[k] += static_cast<float>(part[C + k]);
      }
  }

 private:
  void Check(const TensorDims& d) const {
    if (d.size() < 2 || d[1] != static_cast<int64_t>(mean_.size()) || NumElements(d) == 0)
      Fail(node_, ErrorKind::kInvalidInput,
           "expected an N x " + std::to_string(mean_.size()) + " x ... input, got " + BracketedDims(d));
  }
  Node node_;
  WeightRef scale_, shift_;
  std::vector<float> mean_, inv_std_;
};

// ---- Add, Sub, Mul, Div with ONNX broadcasting (constant operands stay frozen: a constant may
// be part of an operator that an exporter decomposed, such as hardswish's 3 and 6) ----------

// Calls f(i, ia, ib) for every flat index i of `out` with the flat indices of the two inputs
// (read with strides sa and sb: 0 on a broadcast axis).
template <class F>
void ForEachBroadcast(const TensorDims& out, const TensorDims& sa, const TensorDims& sb, F f) {
  const size_t rank = out.size();
  const int64_t total = NumElements(out);
  TensorDims idx(rank, 0);
  int64_t ia = 0, ib = 0;
  for (int64_t i = 0; i < total; ++i) {
    f(i, ia, ib);
    for (size_t a = rank; a-- > 0;) {
      ia += sa[a];
      ib += sb[a];
      if (++idx[a] < out[a]) break;
      ia -= sa[a] * out[a];
      ib -= sb[a] * out[a];
      idx[a] = 0;
    }
  }
}

// An operand of a broadcast as it lies in memory beside a channels-last image output: its dims
// right-aligned to rank 4 and permuted to N, H, W, C, its values transposed where that changes
// their order (a constant with channels and pixels).
struct Operand {
  TensorDims dims;
  const float* v = nullptr;
  std::vector<float> own;  // the transposed copy, where one was needed
};
Operand InMemoryOrder(const Act& a, bool image_out) {
  Operand o;
  o.v = a.v.data();
  if (!image_out || a.cl) {
    o.dims = a.cl ? MemoryDims(a) : a.dims;
    return o;
  }
  TensorDims d = a.dims;
  d.insert(d.begin(), 4 - std::min<size_t>(d.size(), 4), 1);
  o.dims = {d[0], d[2], d[3], d[1]};
  if (d[1] > 1 && d[2] * d[3] > 1) {
    o.own.resize(a.v.size());
    ToChannelsLast(a.v.data(), d, o.own.data());
    o.v = o.own.data();
  }
  return o;
}

class BinaryOpTail : public TailOp {
 public:
  BinaryOpTail(const Node& n, BinaryOp op) : node_(n), op_(op) {}

  void Forward(const std::vector<const Act*>& in, Act* out) override {
    bool ok;
    out->dims = BroadcastDims(in[0]->dims, in[1]->dims, &ok);
    if (!ok || out->dims.size() > 4)
      Fail(node_, ErrorKind::kInvalidInput,
           "inputs " + BracketedDims(in[0]->dims) + " and " + BracketedDims(in[1]->dims) + " do not broadcast");
    out->cl = out->dims.size() == 4;
    if (out->cl &&
        ((in[0]->dims.size() < 4 && !IsConstLike(*in[0])) || (in[1]->dims.size() < 4 && !IsConstLike(*in[1]))))
      Fail(node_, ErrorKind::kUnsupported, "a computed tensor of lower rank broadcast over an image tensor");
    out->v.resize(static_cast<size_t>(NumElements(out->dims)));
    const Operand a = InMemoryOrder(*in[0], out->cl), b = InMemoryOrder(*in[1], out->cl);
    BroadcastBinary(op_, a.v, a.dims, b.v, b.dims, out->cl ? MemoryDims(*out) : out->dims, out->v.data());
  }

  void Backward(const std::vector<const Act*>& in, const Act& out, const Act& dout,
                const std::vector<GradOut>& din) override {
    const TensorDims od = out.cl ? MemoryDims(out) : out.dims;
    for (size_t k = 0; k < 2; ++k) {
      if (!din[k].t) continue;
      const Operand self = InMemoryOrder(*in[k], out.cl), other = InMemoryOrder(*in[1 - k], out.cl);
      if (!self.own.empty()) Fail(node_, ErrorKind::kInternal, "a gradient for a transposed operand");
      // d(out)/d(self) times g, at one position.
      auto local = [op = op_, first = k == 0](float g, float s, float o) {
        switch (op) {
          case BinaryOp::kAdd:
            return g;
          case BinaryOp::kSub:
            return first ? g : -g;
          case BinaryOp::kMul:
            return g * o;
          case BinaryOp::kDiv:
            return first ? g / o : -g * o / (s * s);
        }
        return g;
      };
      const bool add = din[k].add;
      float* dx = Prepare(din[k], *in[k]);
      const float *dy = dout.v.data(), *sv = self.v, *o = other.v;
      if (self.dims == od && other.dims == od) {
        const size_t n = dout.v.size();
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < n; ++i) Put(dx, i, local(dy[i], sv[i], o[i]), add);
        continue;
      }
      // Through the broadcast: an input's gradient sums over the axes it was broadcast along.
      std::vector<float> sum(in[k]->v.size(), 0.f);
      const TensorDims ss = BroadcastStrides(self.dims, od), so = BroadcastStrides(other.dims, od);
      ForEachBroadcast(od, ss, so, [&](int64_t i, int64_t is, int64_t io) {
        sum[static_cast<size_t>(is)] += local(dy[i], sv[is], o[io]);
      });
      for (size_t i = 0; i < sum.size(); ++i) Put(dx, i, sum[i], add);
    }
  }

 private:
  // A tensor whose values do not depend on the image's pixels' order: no pixels, or one value.
  static bool IsConstLike(const Act& a) { return NumElements(a.dims) <= 1 || a.dims.size() <= 3; }
  Node node_;
  BinaryOp op_;
};

// ---- Concat, reshapes, global pooling -------------------------------------------------------

class ConcatOp : public TailOp {
 public:
  explicit ConcatOp(const Node& n) : node_(n), axis_(n.Int("axis", 1)) {}

  void Forward(const std::vector<const Act*>& in, Act* out) override {
    const size_t rank = in[0]->dims.size();
    const size_t axis = static_cast<size_t>(NormalizeAxis(node_, axis_, rank));
    out->dims = in[0]->dims;
    out->cl = in[0]->cl;
    out->dims[axis] = 0;
    for (const Act* a : in) {
      TensorDims d = a->dims, o = out->dims;
      if (d.size() != rank || a->cl != out->cl) Fail(node_, ErrorKind::kInvalidInput, "inputs of different ranks");
      d[axis] = o[axis] = 0;
      if (d != o) Fail(node_, ErrorKind::kInvalidInput, "inputs differ off the concatenation axis");
      out->dims[axis] += a->dims[axis];
    }
    // The axis in memory order (channels-last: C last, H and W one earlier).
    mem_axis_ = out->cl ? std::array<size_t, 4>{0, 3, 1, 2}[axis] : axis;
    out->v.resize(static_cast<size_t>(NumElements(out->dims)));
    const int64_t outer = Outer(*out), row = NumElements(out->dims) / outer;
    std::vector<std::pair<const float*, int64_t>> parts;  // each input's values and run length
    parts.reserve(in.size());
    for (const Act* a : in) parts.emplace_back(a->v.data(), NumElements(a->dims) / outer);
    float* dst = out->v.data();
    // Channels-last along the channels: a short run of each input per pixel, so the pixels are
    // shared among the threads and each run copied inline.
#pragma omp parallel for schedule(static)
    for (int64_t o = 0; o < outer; ++o) {
      float* d = dst + o * row;
      for (const auto& [v, len] : parts) {
        std::copy_n(v + o * len, len, d);
        d += len;
      }
    }
  }

  void Backward(const std::vector<const Act*>& in, const Act& out, const Act& dout,
                const std::vector<GradOut>& din) override {
    const int64_t outer = Outer(out), row = NumElements(out.dims) / outer;
    int64_t at = 0;
    for (size_t k = 0; k < in.size(); ++k) {
      const int64_t len = NumElements(in[k]->dims) / outer;
      if (din[k].t) {
        const bool add = din[k].add;
        float* dx = Prepare(din[k], *in[k]);
        const float* dy = dout.v.data() + at;
#pragma omp parallel for schedule(static)
        for (int64_t o = 0; o < outer; ++o) {
          float* x = dx + o * len;
          const float* y = dy + o * row;
          if (add) {
#pragma omp simd
            for (int64_t j = 0; j < len; ++j) x[j] += y[j];
          } else {
            std::copy_n(y, len, x);
          }
        }
      }
      at += len;
    }
  }

 private:
  int64_t Outer(const Act& a) const {
    const TensorDims d = a.cl ? MemoryDims(a) : a.dims;
    int64_t outer = 1;
    for (size_t i = 0; i < mem_axis_; ++i) outer *= d[i];
    return std::max<int64_t>(outer, 1);
  }
  Node node_;
  int64_t axis_;
  size_t mem_axis_ = 1;
};

// Values in ONNX order (row-major in dims), from an Act of either layout, and back.
std::vector<float> RowMajor(const Act& a) {
  if (!a.cl) return a.v;
  std::vector<float> v(a.v.size());
  ToChannelsFirst(a.v.data(), a.dims, v.data());
  return v;
}
void StoreAs(std::vector<float> row_major, const TensorDims& d, bool cl, float* dst, bool add) {
  if (cl) {
    std::vector<float> t(row_major.size());
    ToChannelsLast(row_major.data(), d, t.data());
    row_major.swap(t);
  }
  for (size_t i = 0; i < row_major.size(); ++i) Put(dst, i, row_major[i], add);
}

// Flatten, Reshape, Squeeze, Unsqueeze: the same values under other dims (an image output
// channels-last again).
class ReshapeOp : public TailOp {
 public:
  ReshapeOp(const Graph& g, const Node& n) : node_(n) {
    for (size_t i = 1; i < n.inputs.size(); ++i) {
      auto it = g.consts.find(n.inputs[i]);
      if (it == g.consts.end()) Fail(n, ErrorKind::kUnsupported, "the target shape must be a constant");
      known_[n.inputs[i]] = it->second;
    }
  }

  void Forward(const std::vector<const Act*>& in, Act* out) override {
    const TensorDims& x = in[0]->dims;
    if (node_.op == "Flatten") {
      const int64_t axis = NormalizeAxis(node_, node_.Int("axis", 1), x.size() + 1);
      int64_t outer = 1;
      for (int64_t a = 0; a < axis; ++a) outer *= x[static_cast<size_t>(a)];
      out->dims = {outer, NumElements(x) / std::max<int64_t>(outer, 1)};
    } else {
      out->dims = ReshapedDims(
          node_,
          [&](const std::string& t) -> const ConstTensor* {
            auto it = known_.find(t);
            return it == known_.end() ? nullptr : &it->second;
          },
          x);
    }
    if (NumElements(out->dims) != NumElements(x))
      Fail(node_, ErrorKind::kInvalidInput, "cannot reshape " + BracketedDims(x) + " to " + BracketedDims(out->dims));
    out->cl = out->dims.size() == 4;
    out->v.resize(in[0]->v.size());
    StoreAs(RowMajor(*in[0]), out->dims, out->cl, out->v.data(), false);
  }

  void Backward(const std::vector<const Act*>& in, const Act&, const Act& dout,
                const std::vector<GradOut>& din) override {
    if (!din[0].t) return;
    const bool add = din[0].add;
    float* dx = Prepare(din[0], *in[0]);
    StoreAs(RowMajor(dout), in[0]->dims, in[0]->cl, dx, add);
  }

 private:
  Node node_;
  std::map<std::string, ConstTensor> known_;
};

// GlobalAveragePool, or ReduceMean over the spatial axes of an NCHW tensor.
class GlobalPoolOp : public TailOp {
 public:
  explicit GlobalPoolOp(const Graph& g, const Node& n) : node_(n) {
    if (n.op == "ReduceMean") {
      bool present;
      std::vector<int64_t> axes = IntsArg(
          n, 1, "axes",
          [&](const std::string& t) -> const ConstTensor* {
            auto it = g.consts.find(t);
            return it == g.consts.end() ? nullptr : &it->second;
          },
          &present);
      std::sort(axes.begin(), axes.end());
      if (axes != std::vector<int64_t>{2, 3} && axes != std::vector<int64_t>{-2, -1})
        Fail(n, ErrorKind::kUnsupported, "only the mean over the spatial axes (2, 3) of an NCHW tensor trains");
      keepdims_ = n.Int("keepdims", 1) != 0;
    }
  }

  void Forward(const std::vector<const Act*>& in, Act* out) override {
    NeedChannelsLast(node_, *in[0]);
    const TensorDims& x = in[0]->dims;
    // [N, C, 1, 1] is the same in both layouts.
    out->dims = keepdims_ ? TensorDims{x[0], x[1], 1, 1} : TensorDims{x[0], x[1]};
    out->cl = keepdims_;
    const int64_t c = x[1], hw = x[2] * x[3];
    out->v.assign(static_cast<size_t>(x[0] * c), 0.f);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < x[0]; ++i) {
      std::vector<double> s(static_cast<size_t>(c), 0.0);
      for (int64_t j = 0; j < hw; ++j)
        for (int64_t k = 0; k < c; ++k)
          s[static_cast<size_t>(k)] += in[0]->v[static_cast<size_t>((i * hw + j) * c + k)];
      for (int64_t k = 0; k < c; ++k)
        out->v[static_cast<size_t>(i * c + k)] =
            static_cast<float>(s[static_cast<size_t>(k)] / static_cast<double>(hw));
    }
  }

  void Backward(const std::vector<const Act*>& in, const Act&, const Act& dout,
                const std::vector<GradOut>& din) override {
    if (!din[0].t) return;
    const TensorDims& x = in[0]->dims;
    const int64_t c = x[1], hw = x[2] * x[3];
    const bool add = din[0].add;
    float* dx = Prepare(din[0], *in[0]);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < x[0]; ++i)
      for (int64_t j = 0; j < hw; ++j)
        for (int64_t k = 0; k < c; ++k)
          Put(dx, static_cast<size_t>((i * hw + j) * c + k),
              dout.v[static_cast<size_t>(i * c + k)] / static_cast<float>(hw), add);
  }

 private:
  Node node_;
  bool keepdims_ = true;
};

// ---- Gemm and MatMul on a constant (trainable) matrix ---------------------------------------

class GemmOp : public TailOp {
 public:
  GemmOp(const Node& n, WeightRef b, WeightRef c) : node_(n), b_(std::move(b)), c_(std::move(c)) {
    const bool gemm = n.op == "Gemm";
    if (!b_.value || b_.dims.size() != 2)
      Fail(n, ErrorKind::kUnsupported, "the second input must be a constant matrix");
    if (gemm && n.Int("transA", 0) != 0) Fail(n, ErrorKind::kUnsupported, "transA=1");
    trans_b_ = gemm && n.Int("transB", 0) != 0;
    alpha_ = gemm ? n.Float("alpha", 1.f) : 1.f;
    beta_ = gemm ? n.Float("beta", 1.f) : 1.f;
    cols_ = trans_b_ ? b_.dims[0] : b_.dims[1];
    k_ = trans_b_ ? b_.dims[1] : b_.dims[0];
    if (c_.value && NumElements(c_.dims) != cols_ && NumElements(c_.dims) != 1)
      Fail(n, ErrorKind::kUnsupported, "C must be a scalar or have one value per output column");
  }

  void Forward(const std::vector<const Act*>& in, Act* out) override {
    const TensorDims& a = in[0]->dims;
    if (a.size() != 2 || a[1] != k_)
      Fail(node_, ErrorKind::kInvalidInput,
           "expected an N x " + std::to_string(k_) + " input, got " + BracketedDims(a));
    const int64_t m = a[0];
    out->dims = {m, cols_};
    out->v.assign(static_cast<size_t>(m * cols_), 0.f);
    Gemm(false, trans_b_, m, cols_, k_, alpha_, in[0]->v.data(), k_, b_.value->data(), trans_b_ ? k_ : cols_, 0.f,
         out->v.data(), cols_);
    if (!c_.value) return;
    const bool scalar = c_.value->size() == 1;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < cols_; ++j)
        out->v[static_cast<size_t>(i * cols_ + j)] += beta_ * (*c_.value)[scalar ? 0 : static_cast<size_t>(j)];
  }

  void Backward(const std::vector<const Act*>& in, const Act&, const Act& dout,
                const std::vector<GradOut>& din) override {
    const int64_t m = in[0]->dims[0];
    const float* dy = dout.v.data();
    if (din[0].t) {
      const bool add = din[0].add;
      float* dx = Prepare(din[0], *in[0]);
      // dA = alpha dY op(B)^T
      Gemm(false, !trans_b_, m, k_, cols_, alpha_, dy, cols_, b_.value->data(), trans_b_ ? k_ : cols_, add ? 1.f : 0.f,
           dx, k_);
    }
    if (b_.grad) {
      if (trans_b_)  // dB (cols x k) = alpha dY^T A
        Gemm(true, false, cols_, k_, m, alpha_, dy, cols_, in[0]->v.data(), k_, 1.f, b_.grad->data(), k_);
      else  // dB (k x cols) = alpha A^T dY
        Gemm(true, false, k_, cols_, m, alpha_, in[0]->v.data(), k_, dy, cols_, 1.f, b_.grad->data(), cols_);
    }
    if (c_.grad) {
      std::vector<float> sums(static_cast<size_t>(cols_), 0.f);
      AddColumnSums(dy, m, cols_, cols_, sums.data());
      if (c_.grad->size() == 1) {
        double s = 0;
        for (float v : sums) s += v;
        (*c_.grad)[0] += beta_ * static_cast<float>(s);
      } else {
        for (size_t j = 0; j < sums.size(); ++j) (*c_.grad)[j] += beta_ * sums[j];
      }
    }
  }

 private:
  Node node_;
  WeightRef b_, c_;
  bool trans_b_ = false;
  float alpha_ = 1, beta_ = 1;
  int64_t cols_ = 0, k_ = 0;
};

const std::set<std::string>& BackwardOps() {
  static const std::set<std::string> ops{"Conv",
                                         "Relu",
                                         "Clip",
                                         "Sigmoid",
                                         "HardSigmoid",
                                         "HardSwish",
                                         "Identity",
                                         "Dropout",
                                         "BatchNormalization",
                                         "Add",
                                         "Sub",
                                         "Mul",
                                         "Div",
                                         "Concat",
                                         "MaxPool",
                                         "AveragePool",
                                         "GlobalAveragePool",
                                         "ReduceMean",
                                         "Flatten",
                                         "Reshape",
                                         "Squeeze",
                                         "Unsqueeze",
                                         "Gemm",
                                         "MatMul"};
  return ops;
}

}  // namespace

bool HasBackward(const std::string& op) { return BackwardOps().count(op) != 0; }

std::optional<Activation> FusableActivation(const Graph& g, const Node& n) {
  if (n.op == "Relu") return Activation{0.f, std::numeric_limits<float>::infinity()};
  if (n.op != "Clip") return std::nullopt;
  const Activation clip = ClipBounds(g, n);
  if (!(clip.lo < clip.hi)) return std::nullopt;
  return clip;
}

TensorDims MemoryDims(const Act& a) {
  if (!a.cl) return a.dims;
  return {a.dims[0], a.dims[2], a.dims[3], a.dims[1]};
}

void ToChannelsLast(const float* nchw, const TensorDims& d, float* nhwc) {
  const int64_t n = d[0], c = d[1], hw = d[2] * d[3];
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < hw; ++j)
      for (int64_t k = 0; k < c; ++k) nhwc[(i * hw + j) * c + k] = nchw[(i * c + k) * hw + j];
}

void ToChannelsFirst(const float* nhwc, const TensorDims& d, float* nchw) {
  const int64_t n = d[0], c = d[1], hw = d[2] * d[3];
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < c; ++k)
      for (int64_t j = 0; j < hw; ++j) nchw[(i * c + k) * hw + j] = nhwc[(i * hw + j) * c + k];
}

std::vector<size_t> TrainableInputs(const Node& n) {
  if (n.op == "Conv" || n.op == "BatchNormalization" || n.op == "Gemm") return {1, 2};
  if (n.op == "MatMul") return {1};
  return {};
}

std::unique_ptr<TailOp> MakeTailOp(const Graph& g, const Node& n, const std::vector<WeightRef>& w) {
  const std::string& t = n.op;
  auto weight = [&](size_t k) { return k < w.size() ? w[k] : WeightRef{}; };
  if (t == "Conv") return std::make_unique<ConvOp>(n, weight(1), weight(2));
  if (t == "MaxPool" || t == "AveragePool") return std::make_unique<PoolOp>(n);
  if (t == "GlobalAveragePool" || t == "ReduceMean") return std::make_unique<GlobalPoolOp>(g, n);
  if (t == "BatchNormalization") return std::make_unique<BatchNormOp>(n, weight(1), weight(2), g);
  if (t == "Add") return std::make_unique<BinaryOpTail>(n, BinaryOp::kAdd);
  if (t == "Sub") return std::make_unique<BinaryOpTail>(n, BinaryOp::kSub);
  if (t == "Mul") return std::make_unique<BinaryOpTail>(n, BinaryOp::kMul);
  if (t == "Div") return std::make_unique<BinaryOpTail>(n, BinaryOp::kDiv);
  if (t == "Concat") return std::make_unique<ConcatOp>(n);
  if (t == "Flatten" || t == "Reshape" || t == "Squeeze" || t == "Unsqueeze") return std::make_unique<ReshapeOp>(g, n);
  if (t == "Gemm" || t == "MatMul") return std::make_unique<GemmOp>(n, weight(1), weight(2));
  if (HasBackward(t)) return MakeUnary(g, n);
  Fail(n, ErrorKind::kUnsupported, "no backward pass for this operator");
}

}  // namespace msaflow::kernels
