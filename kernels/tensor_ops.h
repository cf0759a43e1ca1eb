// Small dense-tensor routines on plain (row-major) float data, for what oneDNN has no primitive
// for: ONNX broadcasting where neither input has the output's shape, transposes, slices and pads
// of any rank, and the shape arithmetic folded when a plan is compiled (kernels/fold.cc).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace msaflow::kernels {

using TensorDims = std::vector<int64_t>;

// The product of the dims (1 for a scalar).
int64_t NumElements(const TensorDims& d);

// The product of the dims, or -1 when a dim is negative or the product passes `limit`.
int64_t BoundedElements(const TensorDims& d, int64_t limit);

// Row-major strides of a plain tensor.
TensorDims PlainStrides(const TensorDims& d);

// ONNX multidirectional broadcasting: the output dims of two inputs aligned at the right. Sets
// *ok = false (and returns {}) where a pair of dims is neither equal nor 1.
TensorDims BroadcastDims(const TensorDims& a, const TensorDims& b, bool* ok);

// The strides with which an input of dims `in` is read for each index of `out` (`in` aligned
// at the right, broadcast axes read with stride 0).
TensorDims BroadcastStrides(const TensorDims& in, const TensorDims& out);

// dst[i] = src[offset + sum_a idx_a(i) * strides[a]] for every index i of `out` (row-major):
// transposes (permuted strides), slices (offset and stepped strides), broadcasts (stride 0).
void StridedCopy(const float* src, int64_t offset, const TensorDims& strides, const TensorDims& out, float* dst);

// ONNX Pad of a plain tensor: pads = begin of each axis then end of each axis (negative crops);
// mode "constant" (value), "reflect" or "edge".
enum class PadMode { kConstant, kReflect, kEdge };
void PadCopy(const float* src, const TensorDims& in, const TensorDims& pads, PadMode mode, float value, float* dst);

// Elementwise a (op) b with broadcasting, both read through BroadcastStrides into `out`.
enum class BinaryOp { kAdd, kSub, kMul, kDiv };
void BroadcastBinary(BinaryOp op, const float* a, const TensorDims& a_dims, const float* b, const TensorDims& b_dims,
                     const TensorDims& out, float* dst);

}  // namespace msaflow::kernels
