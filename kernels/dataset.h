// Labelled image sets in IDX format (LeCun's MNIST format; .gz or plain, read through zlib).
// docs/formats.md describes the layout.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace msaflow::kernels {

struct ImageSet {
  int64_t count = 0, rows = 0, cols = 0;
  std::vector<uint8_t> pixels;  // count * rows * cols, row-major, one byte a pixel
  std::vector<uint8_t> labels;  // count
  int64_t classes() const;      // 1 + the largest label
  // Checksum of the pixels and labels: the content key of this (sub)set.
  std::string Digest() const;
};

// Reads the first `limit` (0 = all) images and labels. Throws kNotFound for a missing file,
// kInvalidInput naming the file for a wrong magic, bad dims, a short body or a count mismatch.
ImageSet ReadIdx(const std::string& images_path, const std::string& labels_path, int64_t limit);

// Writes an IDX image or label file (uncompressed) atomically; used by the data scripts/tests.
void WriteIdxImages(const std::string& path, int64_t count, int64_t rows, int64_t cols, const uint8_t* pixels);
void WriteIdxLabels(const std::string& path, int64_t count, const uint8_t* labels);

}  // namespace msaflow::kernels
