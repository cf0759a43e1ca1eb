#include "kernels/fpga/cost_model.h"

namespace msaflow::kernels::fpga {
namespace {

Modelled Roofline(const Target& t, double results, double bytes) {
  Modelled m;
  if (!t.given()) return m;
  m.compute_s = results / (t.lanes * t.clock_mhz * 1e6);
  m.memory_s = bytes / (t.memory_gbs * 1e9);
  return m;
}

}  // namespace

Modelled ModelPrepare(const Target& t, int64_t images, int64_t rows, int64_t cols, int64_t in_channels,
                      int64_t height, int64_t width, int64_t out_channels, int64_t value_bytes) {
  const double n = static_cast<double>(images);
  const double pixels_out = n * static_cast<double>(height * width);
  const double bytes = n * static_cast<double>(rows * cols * in_channels) +
                       pixels_out * static_cast<double>(out_channels * value_bytes);
  return Roofline(t, pixels_out, bytes);
}

Modelled ModelSelect(const Target& t, int64_t n) {
  const double k = static_cast<double>(n);
  return Roofline(t, k * k, k * 12.0);
}

}  // namespace msaflow::kernels::fpga
