#include "kernels/prepare.h"

#include <algorithm>
#include <cmath>

namespace msaflow::kernels {
namespace {

struct Tap {
  int64_t i0, i1;
  float w1;
};

std::vector<Tap> Taps(int64_t in, int64_t out) {
  std::vector<Tap> taps(static_cast<size_t>(out));
  float scale = static_cast<float>(in) / static_cast<float>(out);
  for (int64_t o = 0; o < out; ++o) {
    float src = (static_cast<float>(o) + 0.5f) * scale - 0.5f;
    src = std::max(src, 0.f);
    int64_t i0 = std::min<int64_t>(static_cast<int64_t>(std::floor(src)), in - 1);
    int64_t i1 = std::min<int64_t>(i0 + 1, in - 1);
    taps[static_cast<size_t>(o)] = {i0, i1, src - static_cast<float>(i0)};
  }
  return taps;
}

}  // namespace

void PrepareBatch(const uint8_t* pixels, int64_t count, int64_t rows, int64_t cols, const InputSpec& spec,
                  float* out) {
  const auto ty = Taps(rows, spec.height), tx = Taps(cols, spec.width);
  const int64_t plane = spec.height * spec.width;
  std::vector<float> gray(static_cast<size_t>(plane));
  for (int64_t n = 0; n < count; ++n) {
    const uint8_t* img = pixels + n * rows * cols;
    for (int64_t y = 0; y < spec.height; ++y) {
      const Tap& a = ty[static_cast<size_t>(y)];
      const uint8_t* r0 = img + a.i0 * cols;
      const uint8_t* r1 = img + a.i1 * cols;
      for (int64_t x = 0; x < spec.width; ++x) {
        const Tap& b = tx[static_cast<size_t>(x)];
        float top = r0[b.i0] + (r0[b.i1] - r0[b.i0]) * b.w1;
        float bot = r1[b.i0] + (r1[b.i1] - r1[b.i0]) * b.w1;
        gray[static_cast<size_t>(y * spec.width + x)] = (top + (bot - top) * a.w1) / 255.f;
      }
    }
    float* dst = out + n * spec.channels * plane;
    for (int64_t c = 0; c < spec.channels; ++c) {
      size_t ci = static_cast<size_t>(std::min<int64_t>(c, 2));
      float m = spec.mean[ci], inv = 1.f / spec.std[ci];
      for (int64_t i = 0; i < plane; ++i) dst[c * plane + i] = (gray[static_cast<size_t>(i)] - m) * inv;
    }
  }
}

}  // namespace msaflow::kernels
