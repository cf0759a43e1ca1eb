// Classifying new images with a trained model: prepared exactly as the run prepared its
// images (kernels/prepare.h, on the CPU path the FPGA kernels match bit for bit), the backbone
// on msaflow's executor, the features rounded to float16 where the run stored them so, the
// head, a softmax. The model comes from a run (TrainedModel) or from a file `msaflow export`
// wrote (its backbone nodes and head weights read back out of the ONNX graph).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "inference/champion.h"
#include "kernels/dataset.h"
#include "kernels/image_codec.h"
#include "kernels/executor.h"

namespace msaflow::inference {

class Classifier {
 public:
  explicit Classifier(const TrainedModel& m);
  // A model file `msaflow export` wrote (without --with-preprocessing or with it).
  static std::unique_ptr<Classifier> FromOnnx(const std::string& path);

  // Probabilities, images.size() x classes(), row-major. Images of any size, 1 or 3 channels.
  std::vector<float> Classify(const std::vector<kernels::DecodedImage>& images);
  // The two halves: images prepared (PreparedSize() floats each: C x H x W as kernels/prepare.h
  // writes them, or raw pixels / 255), and prepared images classified.
  std::vector<float> Prepare(const std::vector<kernels::DecodedImage>& images) const;
  std::vector<float> ClassifyPrepared(const float* x, int64_t n);
  int64_t PreparedSize() const;
  // Run batches of a power-of-two size (padded): what a server with varying batches wants, so
  // that the executor compiles a handful of plans (kernels/executor.h keeps one per shape).
  void set_pow2_batches(bool on) { pow2_batches_ = on; }
  // Images the executor runs at once (default 64, the steps' batch).
  void set_batch(int64_t b) { batch_ = b < 1 ? 1 : b; }
  // Takes raw pixels as read (/ 255, no preparation); resized raw pixels take prepared images as
  // an ONNX backbone does, and are their own features.
  bool raw_pixels() const { return kind_ == workflow::BackboneKind::kPixels && input_.height == 0; }
  const kernels::InputSpec& input() const { return input_; }
  int64_t classes() const { return head_.classes; }
  const std::vector<std::string>& class_names() const { return class_names_; }
  // What the caller should tell the user about how this model computes ("" when it computes as
  // the run did): a run's bf16 or int8 backbone on a CPU without them runs in f32.
  const std::string& note() const { return note_; }

 private:
  Classifier() = default;
  void CheckResizedPixels(const std::string& where) const;

  workflow::BackboneKind kind_ = workflow::BackboneKind::kOnnx;
  kernels::InputSpec input_;
  bool half_ = false;
  bool pow2_batches_ = false;
  int64_t batch_ = 64;
  int64_t pixels_dim_ = 0;  // raw pixels: rows x cols x channels
  kernels::Head head_;
  std::vector<std::string> class_names_;
  std::string note_;
  std::unique_ptr<kernels::Executor> executor_;
  kernels::Graph graph_;
};

// Images to classify, each with where it came from and its label when one is known (-1 if not).
struct Images {
  std::vector<kernels::DecodedImage> images;
  std::vector<std::string> names;  // "file" or "file, image k"
  std::vector<int> labels;
  std::vector<std::string> class_names;  // an image folder's, by label
};

// The images of `paths`: PNG or JPEG files, folders (an image folder with a subfolder per class
// gives labels; any other folder, its PNG and JPEG files in name order), and an IDX (.gz or not)
// or .npy file of uint8 images with its label file `labels` (a single path then). `limit` > 0
// keeps the first images only. Throws kInvalidInput / kNotFound naming the file.
Images ReadImages(const std::vector<std::string>& paths, const std::string& labels, int64_t limit);

}  // namespace msaflow::inference
