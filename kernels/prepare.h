// Image preparation (the DAM FPGA's job on DEEP-EST): gray images become backbone inputs.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace msaflow::kernels {

struct InputSpec {
  int64_t height = 0, width = 0, channels = 3;
  // Pixel p (0..255) becomes (p / 255 - mean[c]) / std[c] in channel c.
  std::array<float, 3> mean{0, 0, 0}, std{1, 1, 1};
};

// Resizes `count` gray images (rows x cols, bytes) bilinearly (half-pixel centres, as
// OpenCV's INTER_LINEAR), replicates the channel, normalises, and writes NCHW floats to `out`
// (count * channels * height * width values).
void PrepareBatch(const uint8_t* pixels, int64_t count, int64_t rows, int64_t cols, const InputSpec& spec,
                  float* out);

}  // namespace msaflow::kernels
