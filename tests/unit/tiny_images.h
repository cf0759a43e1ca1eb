// The unit tests' smallest real dataset: three classes of 8x8 gray images told apart by which
// third is bright, plus noise; IDX files DIR/{train,test}-{images,labels} (90 and 45 images),
// the same bytes every time. A head learns it in a few epochs, so a whole round runs in-process
// in a fraction of a second.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/dataset.h"

namespace msaflow::test_data {

inline void WriteTinyImages(const std::string& dir) {
  std::mt19937 rng(5);
  for (const auto& [split, n] : {std::pair<std::string, int>{"train", 90}, {"test", 45}}) {
    std::vector<uint8_t> px(static_cast<size_t>(n) * 64), lb(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      lb[static_cast<size_t>(i)] = static_cast<uint8_t>(i % 3);
      for (int p = 0; p < 64; ++p)
        px[static_cast<size_t>(i * 64 + p)] =
            static_cast<uint8_t>((p / 22 == i % 3 ? 180 : 20) + static_cast<int>(rng() % 60));
    }
    kernels::WriteIdxImages(dir + "/" + split + "-images", n, 8, 8, px.data());
    kernels::WriteIdxLabels(dir + "/" + split + "-labels", n, lb.data());
  }
}

}  // namespace msaflow::test_data
