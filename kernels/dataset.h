// Labelled image sets, as the datasets' readers give them: IDX (LeCun's MNIST format; .gz or
// plain, read through zlib; here), NumPy .npy arrays (kernels/npy.h) and image folders of PNG
// and JPEG files (kernels/image_folder.h). docs/formats.md describes the layouts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace msaflow::kernels {

struct ImageSet {
  int64_t count = 0;
  int64_t rows = 0, cols = 0;   // every image's size; 0 when sizes vary (see offset)
  int64_t channels = 1;         // 1: gray; 3: RGB, interleaved (HWC); when sizes vary, the most any image has
  std::vector<uint8_t> pixels;  // the images one after the other, row-major
  std::vector<uint8_t> labels;  // count
  // Only when sizes vary (image folders): where each image starts, its size and channels.
  std::vector<int64_t> offset, heights, widths, chans;
  std::vector<std::string> class_names;  // image folders: class index -> folder name
  std::vector<std::string> files;        // image folders: each image's file, for messages

  int64_t classes() const;      // 1 + the largest label
  bool uniform() const { return offset.empty(); }
  int64_t Rows(int64_t i) const { return uniform() ? rows : heights[static_cast<size_t>(i)]; }
  int64_t Cols(int64_t i) const { return uniform() ? cols : widths[static_cast<size_t>(i)]; }
  int64_t Channels(int64_t i) const { return uniform() ? channels : chans[static_cast<size_t>(i)]; }
  const uint8_t* Image(int64_t i) const {
    return pixels.data() + (uniform() ? i * rows * cols * channels : offset[static_cast<size_t>(i)]);
  }
  // "<file>" (folders) or "image <i>" : where image i came from, for messages.
  std::string Where(int64_t i) const;
  // Checksum of the pixels, sizes and labels: the content key of this (sub)set.
  std::string Digest() const;
};

// The images `rows` of `s`, in that order (a validation split, a limit).
ImageSet Subset(const ImageSet& s, const std::vector<int64_t>& rows);

// A stratified split: of each class's images (in order), round(fraction * n) chosen by a
// seeded shuffle (at least one when the class has two or more) go to validation. Returns, per
// image, whether it is in validation. Deterministic for (labels, fraction, seed).
std::vector<bool> StratifiedSplit(const std::vector<uint8_t>& labels, double fraction, uint64_t seed);

// Reads the first `limit` (0 = all) images and labels. Throws kNotFound for a missing file,
// kInvalidInput naming the file for a wrong magic, bad dims, a short body or a count mismatch.
// With a limit below the header's count only the images it takes are read (and decompressed):
// the body must hold them, and what follows them is not looked at.
// An empty labels_path reads the images alone (labels stays empty: predict on unlabelled images).
ImageSet ReadIdx(const std::string& images_path, const std::string& labels_path, int64_t limit);
// Only the labels (the images file's header checked, its pixels not read): for `validate`.
std::vector<uint8_t> ReadIdxLabels(const std::string& images_path, const std::string& labels_path, int64_t limit);

// Writes an IDX image or label file (uncompressed) atomically; used by the data scripts/tests.
void WriteIdxImages(const std::string& path, int64_t count, int64_t rows, int64_t cols, const uint8_t* pixels);
void WriteIdxLabels(const std::string& path, int64_t count, const uint8_t* labels);

}  // namespace msaflow::kernels
