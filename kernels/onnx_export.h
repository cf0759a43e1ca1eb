// ONNX export of a trained classifier: one self-contained graph (opset 13, dynamic batch) that
// does what msaflow does to a prepared image — the cut backbone, global average pooling, the
// features rounded through float16 where the NAM stored them so, the head's standardisation,
// its layers and a softmax — so that ONNX Runtime, OpenCV's dnn, Triton or a phone can run the
// champion without msaflow.
//
// The backbone's nodes are carried over from its cut ONNX model (kernels/onnx_graph.h), moved to
// opset 13 where their form changed (Clip's bounds become inputs, HardSwish becomes
// HardSigmoid x Mul, Dropout an Identity, legacy attributes dropped). With preprocessing, the
// graph takes the raw 8-bit images and resizes and normalises them itself (Resize, linear with
// half-pixel centres as kernels/prepare.h; then / 255, - mean, / std).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kernels/head.h"
#include "kernels/prepare.h"

namespace msaflow::kernels {

// The names every exported graph uses.
inline constexpr const char* kExportInput = "image";
inline constexpr const char* kExportOutput = "probabilities";

struct ClassifierExport {
  // The cut backbone (CutOnnx's bytes) and the tensor it ends at; empty for raw pixels (resized
  // to `input` when input.height > 0, else taken as they come).
  std::string backbone_onnx, cut_tensor;
  std::string origin;  // names the backbone in errors
  InputSpec input;     // what the backbone is fed: channels, height, width, mean, std
  // The images as they come (raw pixels' features, and the input with preprocessing):
  // rows x cols x channels bytes, HWC.
  int64_t image_rows = 0, image_cols = 0, image_channels = 1;
  // Every image has that size (IDX, .npy): with preprocessing the graph takes exactly it and
  // resizes by constant scales (OpenCV's dnn reads no Shape of a dynamic input); else (image
  // folders) any size, the resize's sizes computed from the input's shape.
  bool uniform_images = false;
  bool half_features = false;  // the features were stored as float16 (feature_dtype "f16")
  bool with_preprocessing = false;
  Head head;
  std::map<std::string, std::string> metadata;  // metadata_props, as given
};

// The serialised ModelProto. Without preprocessing the input is float32 [N, C, H, W], prepared
// as kernels/prepare.h does (raw pixels: [N, rows, cols, channels] in 0..1); with it, uint8
// [N, rows, cols, channels]. The output is float32 [N, classes], each row summing to 1.
// Throws kUnsupported naming the node for a backbone the export cannot express at opset 13,
// kInvalidInput for a malformed backbone model.
std::string ExportClassifierOnnx(const ClassifierExport& e);

}  // namespace msaflow::kernels
