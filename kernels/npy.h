// NumPy .npy arrays as a dataset: images uint8 N x H x W (gray) or N x H x W x C (C = 1 or 3),
// labels any integer type, shape (N,). The format (versions 1 to 3) is NumPy's NEP 1.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/dataset.h"

namespace msaflow::kernels {

struct NpyHeader {
  std::string descr;            // e.g. "|u1", "<i8"
  bool fortran_order = false;
  std::vector<int64_t> shape;
  size_t data_offset = 0;       // where the array's bytes start
};

// A whole .npy file (format version 1.0, C order): dtype `descr` (e.g. "<f4"), `shape` as
// NumPy writes it (e.g. "(2, 3)"; taken as given), then `body`.
std::string NpyBytes(const std::string& descr, const std::string& shape, const std::string& body);

// Parses the header of `bytes` (a whole .npy file). Throws kInvalidInput naming `path`.
NpyHeader ParseNpyHeader(const std::string& bytes, const std::string& path);

// The first `limit` (0 = all) images and labels (the images alone for an empty labels_path). Throws kNotFound for a missing file and
// kInvalidInput naming the file for a wrong dtype or shape, a short body, a count mismatch or
// a label outside 0..255 (naming its index).
ImageSet ReadNpy(const std::string& images_path, const std::string& labels_path, int64_t limit);

// What a .npy file can be in a dataset, from its header alone (its first 1 MiB is read) and
// its size: images as ReadNpy takes them, labels as it takes them ((N,) little-endian
// integers), or neither (anything else, unreadable files included). `count` is N.
struct NpyRole {
  enum Kind { kNeither, kImages, kLabels } kind = kNeither;
  int64_t count = 0;
};
NpyRole PeekNpy(const std::string& path);

// Only the labels (and the image count the images' header gives), for checks that need no pixels.
std::vector<uint8_t> ReadNpyLabels(const std::string& images_path, const std::string& labels_path, int64_t limit);

}  // namespace msaflow::kernels
