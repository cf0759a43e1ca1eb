#include "kernels/tensor_ops.h"

#include <algorithm>

namespace msaflow::kernels {

int64_t NumElements(const TensorDims& d) {
  int64_t n = 1;
  for (int64_t v : d) n *= v;
  return n;
}

int64_t BoundedElements(const TensorDims& d, int64_t limit) {
  int64_t n = 1;
  for (int64_t v : d) {
    if (v < 0 || (v > 0 && n > limit / v)) return -1;
    n *= v;
  }
  return n;
}

TensorDims PlainStrides(const TensorDims& d) {
  TensorDims s(d.size(), 1);
  for (size_t a = d.size(); a-- > 1;) s[a - 1] = s[a] * d[a];
  return s;
}

TensorDims BroadcastDims(const TensorDims& a, const TensorDims& b, bool* ok) {
  *ok = true;
  const size_t rank = std::max(a.size(), b.size());
  TensorDims out(rank);
  for (size_t k = 0; k < rank; ++k) {
    const int64_t x = k < rank - a.size() ? 1 : a[k - (rank - a.size())];
    const int64_t y = k < rank - b.size() ? 1 : b[k - (rank - b.size())];
    if (x != y && x != 1 && y != 1) {
      *ok = false;
      return {};
    }
    out[k] = x == 1 ? y : x;
  }
  return out;
}

TensorDims BroadcastStrides(const TensorDims& in, const TensorDims& out) {
  const TensorDims plain = PlainStrides(in);
  TensorDims s(out.size(), 0);
  const size_t lead = out.size() - in.size();
  for (size_t k = 0; k < in.size(); ++k) s[lead + k] = in[k] == 1 ? 0 : plain[k];
  return s;
}

namespace {

// Calls f(dst_index, idx) for every index of `out` in row-major order; idx is the odometer.
template <typename F>
void ForEachIndex(const TensorDims& out, F&& f) {
  const int64_t total = NumElements(out);
  if (total <= 0) return;
  TensorDims idx(out.size(), 0);
  for (int64_t i = 0; i < total; ++i) {
    f(i, idx);
    for (size_t a = out.size(); a-- > 0;) {
      if (++idx[a] < out[a]) break;
      idx[a] = 0;
    }
  }
}

}  // namespace

void StridedCopy(const float* src, int64_t offset, const TensorDims& strides, const TensorDims& out, float* dst) {
  if (out.empty()) {
    dst[0] = src[offset];
    return;
  }
  // Rows of the last axis at a time: the odometer runs over the leading axes only.
  const int64_t inner = out.back(), inner_stride = strides.back();
  TensorDims lead(out.begin(), out.end() - 1);
  int64_t row = 0;
  ForEachIndex(lead, [&](int64_t, const TensorDims& idx) {
    int64_t base = offset;
    for (size_t a = 0; a < idx.size(); ++a) base += idx[a] * strides[a];
    float* d = dst + row * inner;
    for (int64_t k = 0; k < inner; ++k) d[k] = src[base + k * inner_stride];
    ++row;
  });
}

void PadCopy(const float* src, const TensorDims& in, const TensorDims& pads, PadMode mode, float value, float* dst) {
  const size_t rank = in.size();
  TensorDims out(rank);
  for (size_t a = 0; a < rank; ++a) out[a] = in[a] + pads[a] + pads[rank + a];
  const TensorDims stride = PlainStrides(in);
  ForEachIndex(out, [&](int64_t i, const TensorDims& idx) {
    int64_t at = 0;
    for (size_t a = 0; a < rank; ++a) {
      int64_t k = idx[a] - pads[a];
      if (k < 0 || k >= in[a]) {
        if (mode == PadMode::kConstant) {
          dst[i] = value;
          return;
        }
        if (mode == PadMode::kEdge) {
          k = std::clamp<int64_t>(k, 0, in[a] - 1);
        } else {  // reflect, without repeating the edge (pads < dim, checked by the caller)
          k = k < 0 ? -k : 2 * (in[a] - 1) - k;
        }
      }
      at += k * stride[a];
    }
    dst[i] = src[at];
  });
}

namespace {

// dst[k] = a[k * ia] op b[k * ib] for k < n (ia, ib: 1, or 0 for a broadcast value); one loop per
// operator and stride pattern, so that each vectorises.
template <class F>
void BinaryRow(F f, const float* a, int64_t ia, const float* b, int64_t ib, int64_t n, float* dst) {
  if (ia == 1 && ib == 1) {
#pragma omp simd
    for (int64_t k = 0; k < n; ++k) dst[k] = f(a[k], b[k]);
  } else if (ia == 1 && ib == 0) {
    const float y = b[0];
#pragma omp simd
    for (int64_t k = 0; k < n; ++k) dst[k] = f(a[k], y);
  } else if (ia == 0 && ib == 1) {
    const float x = a[0];
#pragma omp simd
    for (int64_t k = 0; k < n; ++k) dst[k] = f(x, b[k]);
  } else {
    for (int64_t k = 0; k < n; ++k) dst[k] = f(a[k * ia], b[k * ib]);
  }
}

template <class F>
void Broadcast(F f, const float* a, const TensorDims& sa, const float* b, const TensorDims& sb, const TensorDims& out,
               float* dst) {
  if (out.empty()) {
    dst[0] = f(a[0], b[0]);
    return;
  }
  // Rows of the last axis at a time: the odometer runs over the leading axes only.
  const int64_t inner = out.back();
  const TensorDims lead(out.begin(), out.end() - 1);
  int64_t row = 0;
  ForEachIndex(lead, [&](int64_t, const TensorDims& idx) {
    int64_t ia = 0, ib = 0;
    for (size_t k = 0; k < idx.size(); ++k) {
      ia += idx[k] * sa[k];
      ib += idx[k] * sb[k];
    }
    BinaryRow(f, a + ia, sa.back(), b + ib, sb.back(), inner, dst + row * inner);
    ++row;
  });
}

}  // namespace

void BroadcastBinary(BinaryOp op, const float* a, const TensorDims& a_dims, const float* b, const TensorDims& b_dims,
                     const TensorDims& out, float* dst) {
  TensorDims sa = BroadcastStrides(a_dims, out), sb = BroadcastStrides(b_dims, out);
  TensorDims shape = out;
  if (a_dims == out && b_dims == out) {  // one row: no odometer
    shape = {NumElements(out)};
    sa = sb = {1};
  }
  switch (op) {
    case BinaryOp::kAdd:
      return Broadcast([](float x, float y) { return x + y; }, a, sa, b, sb, shape, dst);
    case BinaryOp::kSub:
      return Broadcast([](float x, float y) { return x - y; }, a, sa, b, sb, shape, dst);
    case BinaryOp::kMul:
      return Broadcast([](float x, float y) { return x * y; }, a, sa, b, sb, shape, dst);
    case BinaryOp::kDiv:
      return Broadcast([](float x, float y) { return x / y; }, a, sa, b, sb, shape, dst);
  }
}

}  // namespace msaflow::kernels
