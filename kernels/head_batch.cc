#include "kernels/head_batch.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "common/error.h"
#include "kernels/gemm.h"

namespace msaflow::kernels {

double SoftmaxCrossEntropy(const float* z, int64_t ldz, float* dz, int64_t lddz, int64_t n, int64_t m, const uint8_t* y,
                           float scale, int64_t* correct) {
  double loss = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float* zi = z + i * ldz;
    float* di = dz + i * lddz;
    const int64_t arg = std::max_element(zi, zi + m) - zi;
    const float mx = zi[arg];
    if (arg == y[i]) ++*correct;
    double s = 0;
    for (int64_t j = 0; j < m; ++j) s += (di[j] = std::exp(zi[j] - mx));
    for (int64_t j = 0; j < m; ++j) di[j] = static_cast<float>(di[j] / s);
    loss -= std::log(std::max(static_cast<double>(di[y[i]]), 1e-12));
    di[y[i]] -= 1.f;
    for (int64_t j = 0; j < m; ++j) di[j] *= scale;
  }
  return loss;
}

HeadBatch::HeadBatch(const std::vector<const Head*>& heads, int64_t max_rows) : max_rows_(max_rows) {
  if (heads.empty()) Throw(ErrorKind::kInternal, "a head batch needs a head");
  dim_ = heads[0]->in_dim;
  classes_ = heads[0]->classes;
  for (const Head* h : heads) {
    if (h->in_dim != dim_ || h->classes != classes_)
      Throw(ErrorKind::kInternal, "heads trained together must share in_dim and classes");
    Member m;
    m.mlp = h->config.type == "mlp";
    m.width = m.mlp ? h->config.hidden : classes_;
    m.column = width_;
    width_ += m.width;
    heads_.push_back(m);
  }
  size_t off = static_cast<size_t>(width_ * (dim_ + 1));
  for (Member& m : heads_) {
    const size_t w = static_cast<size_t>(m.width), d = static_cast<size_t>(dim_), c = static_cast<size_t>(m.column);
    m.blocks.push_back({c * d, w * d, true});
    m.blocks.push_back({static_cast<size_t>(width_) * d + c, w, false});
    if (m.mlp) {
      m.w2 = off;
      m.b2 = off + w * static_cast<size_t>(classes_);
      m.blocks.push_back({m.w2, w * static_cast<size_t>(classes_), true});
      m.blocks.push_back({m.b2, static_cast<size_t>(classes_), false});
      off = m.b2 + static_cast<size_t>(classes_);
    }
  }
  size_ = off;
  z1_.resize(static_cast<size_t>(max_rows * width_));
  dz1_.resize(z1_.size());
  z2_.resize(static_cast<size_t>(max_rows * classes_));
}

void HeadBatch::Pack(const std::vector<const Head*>& heads, float* params) const {
  for (size_t k = 0; k < heads_.size(); ++k) {
    const std::vector<float>& p = heads[k]->params;
    size_t from = 0;
    for (const ParamBlock& b : heads_[k].blocks) {
      std::memcpy(params + b.offset, p.data() + from, b.size * sizeof(float));
      from += b.size;
    }
  }
}

void HeadBatch::Unpack(const float* params, const std::vector<Head*>& heads) const {
  for (size_t k = 0; k < heads_.size(); ++k) {
    std::vector<float>& p = heads[k]->params;
    size_t to = 0;
    for (const ParamBlock& b : heads_[k].blocks) {
      std::memcpy(p.data() + to, params + b.offset, b.size * sizeof(float));
      to += b.size;
    }
  }
}

void HeadBatch::Accumulate(const float* params, const float* x, const uint8_t* y, int64_t b, float scale, float* grad,
                           double* loss, int64_t* correct, float* dx) {
  if (b > max_rows_) Throw(ErrorKind::kInternal, "head batch: more rows than its buffers hold");
  const int64_t W = width_, C = classes_;
  const float* w1t = params;
  const float* b1 = params + W * dim_;
  float* z1 = z1_.data();
  float* dz1 = dz1_.data();
  // Every head's first layer, z1 = x * W1t^T + b1: a GEMM per head (see the gradient below).
  for (int64_t i = 0; i < b; ++i) std::memcpy(z1 + i * W, b1, static_cast<size_t>(W) * sizeof(float));
  for (const Member& m : heads_)
    Gemm(false, true, b, m.width, dim_, 1.f, x, dim_, w1t + m.column * dim_, dim_, 1.f, z1 + m.column, W);
  for (size_t k = 0; k < heads_.size(); ++k) {
    const Member& m = heads_[k];
    float* zk = z1 + m.column;
    float* dk = dz1 + m.column;
    if (!m.mlp) {
      loss[k] += SoftmaxCrossEntropy(zk, W, dk, W, b, C, y, scale, &correct[k]);
      continue;
    }
    const int64_t hid = m.width;
    for (int64_t i = 0; i < b; ++i)
      for (int64_t j = 0; j < hid; ++j) zk[i * W + j] = std::max(zk[i * W + j], 0.f);
    float* z2 = z2_.data();
    for (int64_t i = 0; i < b; ++i) std::memcpy(z2 + i * C, params + m.b2, static_cast<size_t>(C) * sizeof(float));
    Gemm(false, false, b, C, hid, 1.f, zk, W, params + m.w2, C, 1.f, z2, C);
    loss[k] += SoftmaxCrossEntropy(z2, C, z2, C, b, C, y, scale, &correct[k]);
    Gemm(true, false, hid, C, b, 1.f, zk, W, z2, C, 1.f, grad + m.w2, C);  // dW2 += h^T dz2
    AddColumnSums(z2, b, C, C, grad + m.b2);
    Gemm(false, true, b, hid, C, 1.f, z2, C, params + m.w2, C, 0.f, dk, W);  // dh = dz2 W2^T
    for (int64_t i = 0; i < b; ++i)
      for (int64_t j = 0; j < hid; ++j) dk[i * W + j] = zk[i * W + j] > 0.f ? dk[i * W + j] : 0.f;
  }
  // Every head's first-layer gradient, dW1t += dz1^T x: one GEMM per head. One GEMM over all W
  // columns (here) or rows (above) does not sum every head's share in the order the head's own
  // GEMM does on every CPU (oneDNN's AVX2 sgemm blocks a 552-wide product differently from a
  // 128-wide one; its AVX-512 sgemm happened not to), and Adam turns such last-bit differences
  // of near-zero gradients into whole steps: an MLP head's weights drifted 0.2 from the ones
  // it gets alone. The heads still share the batch, its buffers and one optimiser pass.
  for (const Member& m : heads_)
    Gemm(true, false, m.width, dim_, b, 1.f, dz1 + m.column, W, x, dim_, 1.f, grad + m.column * dim_, dim_);
  AddColumnSums(dz1, b, W, W, grad + W * dim_);
  // dx = sum over heads of dz1_k W1t_k.
  for (size_t k = 0; dx && k < heads_.size(); ++k) {
    const Member& m = heads_[k];
    Gemm(false, false, b, dim_, m.width, 1.f, dz1 + m.column, W, w1t + m.column * dim_, dim_, k ? 1.f : 0.f, dx, dim_);
  }
}

}  // namespace msaflow::kernels
