// IEEE 754 half precision (binary16) for features stored compactly in the NAM: float32 to
// half with round-to-nearest-even, and back exactly. The F16C instructions do the work where
// the CPU has them (every x86-64 since 2012), a portable scalar version elsewhere; both give
// the same bits.
#pragma once

#include <cstddef>
#include <cstdint>

namespace msaflow::kernels {

// Largest finite half; larger magnitudes round to infinity.
constexpr float kHalfMax = 65504.f;

void FloatToHalf(const float* in, uint16_t* out, size_t n);
void HalfToFloat(const uint16_t* in, float* out, size_t n);

// `in` rounded to float16 and back into `out` (may be `in`): what a float32 tensor stored as
// float16 reads back as.
void RoundThroughHalf(const float* in, size_t n, float* out);

// The scalar versions (what the vector paths must match; exposed for the tests).
uint16_t FloatToHalfScalar(float f);
float HalfToFloatScalar(uint16_t h);

}  // namespace msaflow::kernels
