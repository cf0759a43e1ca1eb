#include "kernels/half.h"

#include <algorithm>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define MSAFLOW_HAVE_F16C_PATH 1
#endif

namespace msaflow::kernels {

uint16_t FloatToHalfScalar(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t mant = x & 0x7fffffu;
  const int32_t exp = static_cast<int32_t>((x >> 23) & 0xffu);
  if (exp == 0xff) return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u | (mant >> 13) : 0u));  // inf, NaN
  const int32_t e = exp - 127 + 15;
  if (e >= 31) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow: infinity
  if (e <= 0) {                                               // a subnormal half, or zero
    if (e < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000u;
    const int shift = 14 - e;
    uint32_t half = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;  // a carry into the exponent is right
  return static_cast<uint16_t>(sign | half);
}

float HalfToFloatScalar(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  uint32_t x;
  if (exp == 0) {
    const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;  // mant * 2^-24, exact
    std::memcpy(&x, &v, sizeof x);
    x |= sign;
  } else if (exp == 31) {
    x = sign | 0x7f800000u | (mant << 13);
  } else {
    x = sign | ((exp + 112u) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &x, sizeof f);
  return f;
}

#ifdef MSAFLOW_HAVE_F16C_PATH
namespace {

// CPUID leaf 1 rather than __builtin_cpu_supports("f16c"), which clang 14 does not know: F16C and
// AVX on the CPU, and the OS saving the AVX registers (OSXSAVE, then XCR0's SSE and AVX bits).
bool DetectF16C() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
  const bool f16c = ecx & (1u << 29), avx = ecx & (1u << 28), osxsave = ecx & (1u << 27);
  if (!f16c || !avx || !osxsave) return false;
  unsigned lo = 0, hi = 0;
  __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (lo & 0x6u) == 0x6u;
}

bool HasF16C() {
  static const bool has = DetectF16C();
  return has;
}

__attribute__((target("avx,f16c"))) size_t ToHalfF16C(const float* in, uint16_t* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  return i;
}

__attribute__((target("avx,f16c"))) size_t ToFloatF16C(const uint16_t* in, float* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  return i;
}

}  // namespace
#endif

void FloatToHalf(const float* in, uint16_t* out, size_t n) {
  size_t i = 0;
#ifdef MSAFLOW_HAVE_F16C_PATH
  if (HasF16C()) i = ToHalfF16C(in, out, n);
#endif
  for (; i < n; ++i) out[i] = FloatToHalfScalar(in[i]);
}

void HalfToFloat(const uint16_t* in, float* out, size_t n) {
  size_t i = 0;
#ifdef MSAFLOW_HAVE_F16C_PATH
  if (HasF16C()) i = ToFloatF16C(in, out, n);
#endif
  for (; i < n; ++i) out[i] = HalfToFloatScalar(in[i]);
}

void RoundThroughHalf(const float* in, size_t n, float* out) {
  constexpr size_t kChunk = 4096;
  uint16_t h[kChunk];
  for (size_t lo = 0; lo < n; lo += kChunk) {
    const size_t m = std::min(kChunk, n - lo);
    FloatToHalf(in + lo, h, m);
    HalfToFloat(h, out + lo, m);
  }
}

}  // namespace msaflow::kernels
