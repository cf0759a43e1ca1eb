// Classification heads trained on frozen backbone features: softmax regression and a small
// MLP (one hidden ReLU layer), minibatch SGD (momentum 0.9) or Adam, L2 on the weights.
// Deterministic for a seed: same features + config + seed give bit-identical weights.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace msaflow::kernels {

struct HeadConfig {
  std::string type = "softmax";  // "softmax" | "mlp"
  int64_t hidden = 0;            // mlp only
  std::string optimizer = "adam";  // "adam" | "sgd"
  double lr = 1e-3;
  double l2 = 1e-4;
  int64_t epochs = 10;
  int64_t batch = 64;
  uint64_t seed = 1;
};

// A trained head. Features are standardised with the training set's mean/std first.
struct Head {
  HeadConfig config;
  int64_t in_dim = 0, classes = 0;
  std::vector<float> mean, inv_std;  // in_dim each
  // softmax: {W [in_dim x classes], b [classes]}; mlp: {W1, b1, W2, b2}.
  std::vector<std::vector<float>> params;
  std::vector<double> curve_loss, curve_acc;  // per epoch, on the training set

  // Logits for n rows of features (n x in_dim) -> n x classes.
  std::vector<float> Logits(const float* x, int64_t n) const;
  // Flat float32 parameters (mean, inv_std, params...) and back; shapes come from the config.
  std::string Serialize() const;
  static Head Deserialize(const HeadConfig& cfg, int64_t in_dim, int64_t classes, const std::string& bytes);
};

// Trains on n rows (x: n x dim, y: labels < classes). `init` (optional) warm-starts from a head
// of the same shape. Throws kInvalidInput for empty data or a config out of range.
Head TrainHead(const HeadConfig& cfg, const float* x, const uint8_t* y, int64_t n, int64_t dim, int64_t classes,
               const Head* init = nullptr);

}  // namespace msaflow::kernels
