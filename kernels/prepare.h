// Image preparation (the DAM FPGA's job on DEEP-EST): images become backbone inputs. This is
// the C++ arithmetic; kernels/fpga/prepare.cl is the same arithmetic in OpenCL C, fed the same
// taps and constants (PrepareConstants), so both give bit-identical outputs.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace msaflow::kernels {

struct InputSpec {
  int64_t height = 0, width = 0, channels = 3;
  int64_t batch = 0;  // a model exported with a fixed batch size: run it on exactly this many (0: any)
  // Pixel p (0..255) becomes (p / 255 - mean[c]) / std[c] in channel c.
  std::array<float, 3> mean{0, 0, 0}, std{1, 1, 1};
};

// `count` images of rows x cols pixels with `channels` (1: gray, 3: RGB) interleaved bytes each
// (row-major, HWC).
struct ImageBatch {
  const uint8_t* pixels = nullptr;
  int64_t count = 0, rows = 0, cols = 0, channels = 1;
};

// Bilinear resize coefficients from one axis length to another (half-pixel centres, as OpenCV's
// INTER_LINEAR): output o reads inputs i0[o] and i1[o] with weight w1[o] on i1.
struct Taps {
  std::vector<int32_t> i0, i1;
  std::vector<float> w1;
};
Taps MakeTaps(int64_t in, int64_t out);

// What every backend multiplies by, computed once on the host:
//   x[c] = (v * k255 - mean[c]) * inv_std[c]         (v: the interpolated 0..255 value)
//   q[c] = saturate_int8(round_half_even(x[c] * inv_q[c]))   (the int8 path; x = q * q_scale[c])
// An RGB image for a one-channel model is reduced to luma: v = (0.299 r + 0.587 g) + 0.114 b.
// A gray image for a three-channel model is replicated; RGB for RGB is kept.
struct PrepareConstants {
  float k255 = 1.f / 255.f;
  std::array<float, 3> mean{}, inv_std{}, inv_q{}, q_scale{};
  std::array<float, 3> luma{0.299f, 0.587f, 0.114f};
};
PrepareConstants MakeConstants(const InputSpec& spec);

// Writes count * spec.channels * spec.height * spec.width values, NCHW.
void PrepareBatch(const ImageBatch& in, const InputSpec& spec, float* out);
// The int8 path: the same values quantised symmetrically per channel (q_scale in
// MakeConstants), for a board whose link to the backbone carries bytes, not floats.
void PrepareBatchInt8(const ImageBatch& in, const InputSpec& spec, int8_t* out);

// Gray images, as most callers hold them.
inline void PrepareBatch(const uint8_t* pixels, int64_t count, int64_t rows, int64_t cols, const InputSpec& spec,
                         float* out) {
  PrepareBatch(ImageBatch{pixels, count, rows, cols, 1}, spec, out);
}

// Throws kInvalidInput unless the batch and spec describe something preparable (channels 1 or
// 3 in, 1..3 out, positive sizes).
void CheckPrepare(const ImageBatch& in, const InputSpec& spec);

}  // namespace msaflow::kernels
