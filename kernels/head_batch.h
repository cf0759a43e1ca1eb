// Heads trained together on the same batches (parallel/train_sync.cc): their first layers
// stacked into one matrix and one parameter vector, so that they share the batch, its buffers
// and one optimiser pass per step; each head's first layer and its gradient are each one GEMM
// of the head's own shape on the shared buffers (not one GEMM over all heads: its sums are not
// every head's own on every CPU, see head_batch.cc), so every head gets bit for bit the
// gradient it gets alone. The second layers of MLP heads (hidden x classes) go one head at a
// time too. The heads share in_dim and classes (the same backbone's features).
//
// The batch's parameter vector, for heads k = 0..K-1 with first-layer widths w_k (classes for
// softmax, hidden for mlp) and W = sum w_k:
//   W1t [W x in]   head k's rows are its Wt or W1t block, contiguous, in head order
//   b1  [W]        head k's first-layer biases
//   then for each mlp head in order: W2 [hidden x classes], b2 [classes]
// For one head this is exactly Head::params (kernels/head.h), so a batch of one is the single
// head's kernel.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/head.h"

namespace msaflow::kernels {

class HeadBatch {
 public:
  // heads: at least one, all of the same in_dim and classes. Buffers are sized for max_rows.
  HeadBatch(const std::vector<const Head*>& heads, int64_t max_rows);

  size_t size() const { return size_; }  // floats in the batch's parameter vector
  size_t heads() const { return heads_.size(); }
  // Head k's parameters inside the batch's vector: its blocks in ParamLayout order, with the
  // offsets of the batch's vector.
  const std::vector<ParamBlock>& Blocks(size_t k) const { return heads_[k].blocks; }
  void Pack(const std::vector<const Head*>& heads, float* params) const;  // heads' params -> vector
  void Unpack(const float* params, const std::vector<Head*>& heads) const;

  // At `params`, for b standardised rows x (b <= max_rows): grad += scale * d(sum of every
  // row's cross-entropy)/d(params) for every head; loss[k] += head k's summed loss and
  // correct[k] += its argmax hits. With dx (b x in_dim), also dx = scale * d(the heads' summed
  // losses)/d(x), the gradient a fine-tuned backbone's tail trains on (kernels/tail.h).
  void Accumulate(const float* params, const float* x, const uint8_t* y, int64_t b, float scale, float* grad,
                  double* loss, int64_t* correct, float* dx = nullptr);

 private:
  struct Member {
    bool mlp = false;
    int64_t width = 0, column = 0;  // first-layer outputs and where they start among all W
    size_t w2 = 0, b2 = 0;          // mlp: offsets of W2 and b2 in the vector
    std::vector<ParamBlock> blocks;
  };
  std::vector<Member> heads_;
  int64_t dim_ = 0, classes_ = 0, width_ = 0, max_rows_ = 0;
  size_t size_ = 0;
  std::vector<float> z1_, dz1_, z2_;  // max_rows x W, max_rows x W, max_rows x classes
};

// Softmax of the rows of z (n x m, row stride ldz) and its cross-entropy gradient:
// dz = scale * (softmax - onehot(y)) (row stride lddz; dz may be z). Returns the summed
// cross-entropy and adds argmax hits to *correct.
double SoftmaxCrossEntropy(const float* z, int64_t ldz, float* dz, int64_t lddz, int64_t n, int64_t m,
                           const uint8_t* y, float scale, int64_t* correct);

}  // namespace msaflow::kernels
