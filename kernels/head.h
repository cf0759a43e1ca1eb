// Classification heads trained on frozen backbone features: softmax regression and a small
// MLP (one hidden ReLU layer), minibatch SGD (momentum 0.9) or Adam, or full-batch L-BFGS,
// L2 on the weights.
// This file holds the pieces every training mode shares (parallel/train.h puts them
// together): the parameters as one flat vector, their initialisation, the gradient of a batch,
// and the optimiser step on any slice of the parameters (a parameter server owns a slice).
// Deterministic for a seed: same features + config + seed give bit-identical weights.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace msaflow::kernels {

struct HeadConfig {
  std::string type = "softmax";  // "softmax" | "mlp"
  int64_t hidden = 0;            // mlp only
  std::string optimizer = "adam";  // "adam" | "sgd" (minibatch) | "lbfgs" (full batch; parallel/train_lbfgs.cc)
  double lr = 1e-3;
  double l2 = 1e-4;
  int64_t epochs = 10;
  int64_t batch = 64;
  uint64_t seed = 1;       // the initial weights
  uint64_t data_seed = 0;  // the order of the rows: heads that share it (and batch) see the same batches
};

// One block of the flat parameter vector: softmax {Wt [classes x in], b [classes]};
// mlp {W1t [hidden x in], b1 [hidden], W2 [hidden x classes], b2 [classes]}, row-major. The
// first layer is stored transposed (a row per output) so that heads trained together stack
// their first layers into one matrix (kernels/head_batch.h). L2 applies to the W blocks.
struct ParamBlock {
  size_t offset = 0, size = 0;
  bool decay = false;
};
std::vector<ParamBlock> ParamLayout(const HeadConfig& cfg, int64_t in_dim, int64_t classes);

// One point of a training curve: after `step` optimiser updates and `seconds` of training.
struct CurvePoint {
  int64_t step = 0;
  double seconds = 0;
  double loss = 0, accuracy = 0;  // on the training rows seen since the previous point
};

// One row of dim features standardised: out[j] = (x[j] - mean[j]) * inv_std[j]. The one place
// the formula is written: Head::Standardize, Head::Logits and training's batch gathering
// (parallel::TrainData) all call it, so they agree bit for bit.
void StandardizeRow(const float* x, const float* mean, const float* inv_std, int64_t dim, float* out);

// A trained head. Features are standardised with the training set's mean/std first.
struct Head {
  HeadConfig config;
  int64_t in_dim = 0, classes = 0;
  std::vector<float> mean, inv_std;  // in_dim each
  std::vector<float> params;         // flat, in ParamLayout order
  std::vector<CurvePoint> curve;     // one point per epoch (or per epoch's worth of updates)

  // Logits for n rows of features (n x in_dim) -> n x classes.
  std::vector<float> Logits(const float* x, int64_t n) const;
  // out[n x in_dim] = (x - mean) * inv_std.
  void Standardize(const float* x, int64_t n, float* out) const;
  // Flat float32 (mean, inv_std, params) and back; shapes come from the config.
  std::string Serialize() const;
  static Head Deserialize(const HeadConfig& cfg, int64_t in_dim, int64_t classes, const std::string& bytes);
};

// The layout of Head::params and of stored model bytes (model metadata "weights_layout").
inline constexpr const char* kWeightsLayout = "msaflow.head/2";

// A head ready to train on n rows (x: n x dim, y: labels < classes): standardisation from the
// rows, Glorot-uniform weights from cfg.seed, zero biases; or, with `init` (same shape),
// a warm start from its statistics and weights. Throws kInvalidInput for empty data, a label
// out of range or a config out of range.
Head InitHead(const HeadConfig& cfg, const float* x, const uint8_t* y, int64_t n, int64_t dim, int64_t classes,
              const Head* init = nullptr);

// Forward and backward passes of one batch for one head (kernels/head_batch.h does many).
class HeadBatch;
class GradientKernel {
 public:
  GradientKernel(const Head& h, int64_t max_rows);
  ~GradientKernel();
  // x: b standardised rows (b <= max_rows). Adds scale * d(sum of the rows' cross-entropy)/d(params)
  // into grad (params.size() floats); returns the summed loss and adds argmax hits to *correct.
  // With dx (b x in_dim): also dx = scale * d(sum of the rows' cross-entropy)/d(x).
  double Accumulate(const Head& h, const float* x, const uint8_t* y, int64_t b, float scale, float* grad,
                    int64_t* correct, float* dx = nullptr);

 private:
  std::unique_ptr<HeadBatch> batch_;
};

// The optimiser for params[lo, hi): Adam (beta1 = momentum, beta2 = 0.999) or SGD with
// momentum; L2 adds l2 * w to the gradient of decayed blocks. Its state covers only that slice.
// kMomentum is the usual 0.9; asynchronous training passes less (parallel/train_ps.cc).
inline constexpr float kMomentum = 0.9f;
class Optimizer {
 public:
  Optimizer(const HeadConfig& cfg, const std::vector<ParamBlock>& layout, size_t lo, size_t hi,
            float momentum = kMomentum);
  // params and grad point at element `lo` of their vectors; grad is the batch-mean gradient.
  void Step(float* params, const float* grad);
  int64_t steps() const { return t_; }
  size_t lo() const { return lo_; }

 private:
  struct Run {  // [begin, end) relative to lo, with or without L2
    size_t begin, end;
    bool decay;
  };
  HeadConfig cfg_;
  size_t lo_;
  float momentum_;
  std::vector<Run> runs_;
  std::vector<float> m_, v_;
  int64_t t_ = 0;
};

}  // namespace msaflow::kernels
