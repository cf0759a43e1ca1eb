#include "kernels/prepare.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "common/error.h"

namespace msaflow::kernels {
namespace {

// The operations below are written out one rounding at a time, in the order prepare.cl does
// them; the build never contracts a * b + c into one fused operation (-ffp-contract=off), so
// the CPU and OpenCL backends agree bit for bit.
template <typename Emit>
void ForEachValue(const ImageBatch& in, const InputSpec& spec, const PrepareConstants& k, Emit emit) {
  const Taps ty = MakeTaps(in.rows, spec.height), tx = MakeTaps(in.cols, spec.width);
  const int64_t plane = spec.height * spec.width, cin = in.channels, cout = spec.channels;
  const int64_t stride = in.cols * cin;
  for (int64_t n = 0; n < in.count; ++n) {
    const uint8_t* img = in.pixels + n * in.rows * stride;
    for (int64_t y = 0; y < spec.height; ++y) {
      const uint8_t* r0 = img + ty.i0[static_cast<size_t>(y)] * stride;
      const uint8_t* r1 = img + ty.i1[static_cast<size_t>(y)] * stride;
      const float wy = ty.w1[static_cast<size_t>(y)];
      for (int64_t x = 0; x < spec.width; ++x) {
        const size_t xs = static_cast<size_t>(x);
        const int64_t a = tx.i0[xs] * cin, b = tx.i1[xs] * cin;
        const float wx = tx.w1[xs];
        float v[3];
        for (int64_t c = 0; c < cin; ++c) {
          float top = static_cast<float>(r0[a + c]) + static_cast<float>(r0[b + c] - r0[a + c]) * wx;
          float bot = static_cast<float>(r1[a + c]) + static_cast<float>(r1[b + c] - r1[a + c]) * wx;
          v[c] = top + (bot - top) * wy;
        }
        if (cin == 3 && cout == 1) {
          float l = k.luma[0] * v[0] + k.luma[1] * v[1];
          v[0] = l + k.luma[2] * v[2];
        }
        const int64_t o = n * cout * plane + y * spec.width + x;
        for (int64_t c = 0; c < cout; ++c) {
          const size_t ci = static_cast<size_t>(c);
          float g = v[std::min(c, cin - 1)] * k.k255;
          emit(o + c * plane, ci, (g - k.mean[ci]) * k.inv_std[ci]);
        }
      }
    }
  }
}

}  // namespace

Taps MakeTaps(int64_t in, int64_t out) {
  Taps t;
  t.i0.resize(static_cast<size_t>(out));
  t.i1.resize(static_cast<size_t>(out));
  t.w1.resize(static_cast<size_t>(out));
  float scale = static_cast<float>(in) / static_cast<float>(out);
  for (int64_t o = 0; o < out; ++o) {
    float src = (static_cast<float>(o) + 0.5f) * scale - 0.5f;
    src = std::max(src, 0.f);
    int64_t i0 = std::min<int64_t>(static_cast<int64_t>(std::floor(src)), in - 1);
    const size_t os = static_cast<size_t>(o);
    t.i0[os] = static_cast<int32_t>(i0);
    t.i1[os] = static_cast<int32_t>(std::min<int64_t>(i0 + 1, in - 1));
    t.w1[os] = src - static_cast<float>(i0);
  }
  return t;
}

PrepareConstants MakeConstants(const InputSpec& spec) {
  PrepareConstants k;
  for (size_t c = 0; c < 3; ++c) {
    k.mean[c] = spec.mean[c];
    k.inv_std[c] = 1.f / spec.std[c];
    // Symmetric quantisation over the range a channel can take, [(0 - m) / s, (1 - m) / s].
    float lo = (0.f - k.mean[c]) * k.inv_std[c], hi = (1.f - k.mean[c]) * k.inv_std[c];
    float amax = std::max(std::fabs(lo), std::fabs(hi));
    if (!(amax > 0)) amax = 1;
    k.q_scale[c] = amax / 127.f;
    k.inv_q[c] = 127.f / amax;
  }
  return k;
}

void CheckPrepare(const ImageBatch& in, const InputSpec& spec) {
  auto bad = [](const std::string& what) { Throw(ErrorKind::kInvalidInput, "prepare: " + what); };
  if (in.channels != 1 && in.channels != 3)
    bad("images have " + std::to_string(in.channels) + " channels; expected 1 (gray) or 3 (RGB)");
  if (spec.channels < 1 || spec.channels > 3)
    bad("the model wants " + std::to_string(spec.channels) + " input channels; expected 1..3");
  if (in.rows < 1 || in.cols < 1) bad("images of " + std::to_string(in.rows) + " x " + std::to_string(in.cols) + " pixels");
  if (spec.height < 1 || spec.width < 1)
    bad("a model input of " + std::to_string(spec.height) + " x " + std::to_string(spec.width));
  if (in.count < 0) bad("a negative image count");
  if (in.rows > INT32_MAX || in.cols > INT32_MAX || spec.height > INT32_MAX || spec.width > INT32_MAX)
    bad("images or model input larger than 2^31 pixels per side");
}

void PrepareBatch(const ImageBatch& in, const InputSpec& spec, float* out) {
  CheckPrepare(in, spec);
  ForEachValue(in, spec, MakeConstants(spec), [out](int64_t i, size_t, float x) { out[i] = x; });
}

void PrepareBatchInt8(const ImageBatch& in, const InputSpec& spec, int8_t* out) {
  CheckPrepare(in, spec);
  const PrepareConstants k = MakeConstants(spec);
  ForEachValue(in, spec, k, [out, &k](int64_t i, size_t c, float x) {
    float q = std::nearbyint(x * k.inv_q[c]);  // round half to even, as OpenCL's _rte
    out[i] = static_cast<int8_t>(std::min(127.f, std::max(-128.f, q)));
  });
}

}  // namespace msaflow::kernels
