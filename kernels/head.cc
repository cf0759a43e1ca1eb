#include "kernels/head.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <numeric>
#include <random>

#include "common/error.h"
#include "kernels/gemm.h"
#include "kernels/head_batch.h"

namespace msaflow::kernels {
namespace {
// Below this many values a pass over features stays on the calling thread.
constexpr int64_t kParallelValues = int64_t{1} << 16;

// Rows [lo, hi) of x standardised into out, on the calling thread.
void StandardizeRows(const Head& h, const float* x, int64_t lo, int64_t hi, float* out) {
  const int64_t d = h.in_dim;
  for (int64_t i = lo; i < hi; ++i) StandardizeRow(x + i * d, h.mean.data(), h.inv_std.data(), d, out + i * d);
}
}  // namespace

void StandardizeRow(const float* x, const float* mean, const float* inv_std, int64_t dim, float* out) {
  for (int64_t j = 0; j < dim; ++j) out[j] = (x[j] - mean[j]) * inv_std[j];
}

void Head::Standardize(const float* x, int64_t n, float* out) const {
#pragma omp parallel for schedule(static) if (n * in_dim >= kParallelValues)
  for (int64_t i = 0; i < n; ++i) StandardizeRows(*this, x, i, i + 1, out);
}

std::vector<ParamBlock> ParamLayout(const HeadConfig& cfg, int64_t in_dim, int64_t classes) {
  std::vector<size_t> sizes;
  if (cfg.type == "mlp") {
    sizes = {static_cast<size_t>(in_dim * cfg.hidden), static_cast<size_t>(cfg.hidden),
             static_cast<size_t>(cfg.hidden * classes), static_cast<size_t>(classes)};
  } else {
    sizes = {static_cast<size_t>(in_dim * classes), static_cast<size_t>(classes)};
  }
  std::vector<ParamBlock> out;
  size_t off = 0;
  for (size_t k = 0; k < sizes.size(); ++k) {
    out.push_back({off, sizes[k], k % 2 == 0});
    off += sizes[k];
  }
  return out;
}

namespace {
size_t ParamCount(const std::vector<ParamBlock>& layout) { return layout.back().offset + layout.back().size; }
}  // namespace

std::vector<float> Head::Logits(const float* x, int64_t n) const {
  // Rows go in blocks of kLogitsBlock counted from the call's first row, each block's GEMMs on
  // one thread and the blocks spread over the threads. oneDNN's sgemm sums in an order that
  // depends on its thread count and row count (AVX2: a 10-column product over 1,000 rows
  // differs in the last bit between 1 and 2 threads), so one multi-threaded GEMM gave a rank
  // of a 4-rank evaluate farm (1 thread each) other losses than one rank alone (2 threads).
  constexpr int64_t kLogitsBlock = 64;
  const auto layout = ParamLayout(config, in_dim, classes);
  auto at = [&](size_t k) { return params.data() + layout[k].offset; };
  // y[b x m] = a[b x k] * Wt^T + bias, Wt being m x k.
  auto dense_t = [](const float* a, int64_t b, int64_t k, const float* wt, const float* bias, int64_t m, float* y) {
    for (int64_t i = 0; i < b; ++i) std::memcpy(y + i * m, bias, static_cast<size_t>(m) * sizeof(float));
    Gemm(false, true, b, m, k, 1.f, a, k, wt, k, 1.f, y, m);
  };
  std::vector<float> out(static_cast<size_t>(n * classes));
  const int64_t blocks = (n + kLogitsBlock - 1) / kLogitsBlock;
  const bool mlp = config.type != "softmax";
  std::exception_ptr failed;  // an exception may not leave an OpenMP region
#pragma omp parallel
  {
    std::vector<float> xs(static_cast<size_t>(kLogitsBlock * in_dim));
    std::vector<float> h(mlp ? static_cast<size_t>(kLogitsBlock * config.hidden) : 0);
#pragma omp for schedule(static)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      try {
        const int64_t lo = blk * kLogitsBlock, b = std::min(kLogitsBlock, n - lo);
        float* y = out.data() + lo * classes;
        StandardizeRows(*this, x + lo * in_dim, 0, b, xs.data());  // this thread's block: no nested team
        if (!mlp) {
          dense_t(xs.data(), b, in_dim, at(0), at(1), classes, y);
          continue;
        }
        dense_t(xs.data(), b, in_dim, at(0), at(1), config.hidden, h.data());
        for (auto& v : h) v = std::max(v, 0.f);
        for (int64_t i = 0; i < b; ++i) std::memcpy(y + i * classes, at(3), static_cast<size_t>(classes) * sizeof(float));
        Gemm(false, false, b, classes, config.hidden, 1.f, h.data(), config.hidden, at(2), classes, 1.f, y, classes);
      } catch (...) {
#pragma omp critical(msaflow_head_logits)
        if (!failed) failed = std::current_exception();
      }
    }
  }
  if (failed) std::rethrow_exception(failed);
  return out;
}

std::string Head::Serialize() const {
  std::string b;
  auto put = [&](const std::vector<float>& v) {
    b.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  };
  put(mean);
  put(inv_std);
  put(params);
  return b;
}

Head Head::Deserialize(const HeadConfig& cfg, int64_t in_dim, int64_t classes, const std::string& bytes) {
  Head h;
  h.config = cfg;
  h.in_dim = in_dim;
  h.classes = classes;
  size_t np = ParamCount(ParamLayout(cfg, in_dim, classes));
  size_t total = (2 * static_cast<size_t>(in_dim) + np) * sizeof(float);
  if (bytes.size() != total)
    Throw(ErrorKind::kCorrupt, "head weights: " + std::to_string(bytes.size()) + " bytes, expected " +
                                   std::to_string(total) + " for a " + cfg.type + " head " + std::to_string(in_dim) +
                                   "->" + std::to_string(classes));
  auto take = [&](std::vector<float>& v, size_t count, size_t& off) {
    v.resize(count);
    std::memcpy(v.data(), bytes.data() + off, count * sizeof(float));
    off += count * sizeof(float);
  };
  size_t off = 0;
  take(h.mean, static_cast<size_t>(in_dim), off);
  take(h.inv_std, static_cast<size_t>(in_dim), off);
  take(h.params, np, off);
  return h;
}

Head InitHead(const HeadConfig& cfg, const float* x, const uint8_t* y, int64_t n, int64_t dim, int64_t classes,
              const Head* init) {
  if (n <= 0 || dim <= 0 || classes < 2) Throw(ErrorKind::kInvalidInput, "train: need rows, features and >= 2 classes");
  if (cfg.type != "softmax" && cfg.type != "mlp") Throw(ErrorKind::kInvalidInput, "train: unknown head type " + cfg.type);
  if (cfg.type == "mlp" && cfg.hidden <= 0) Throw(ErrorKind::kInvalidInput, "train: mlp needs hidden > 0");
  if (cfg.batch <= 0 || cfg.epochs <= 0 || !(cfg.lr > 0))
    Throw(ErrorKind::kInvalidInput, "train: batch, epochs and lr must be positive");
  for (int64_t i = 0; i < n; ++i)
    if (y[i] >= classes)
      Throw(ErrorKind::kInvalidInput, "train: row " + std::to_string(i) + " has label " + std::to_string(y[i]) +
                                          ", expected 0.." + std::to_string(classes - 1));
  Head h;
  h.config = cfg;
  h.in_dim = dim;
  h.classes = classes;
  if (init) {
    if (init->in_dim != dim || init->classes != classes || init->config.type != cfg.type ||
        init->config.hidden != cfg.hidden)
      Throw(ErrorKind::kInvalidInput, "train: warm start from a head of another shape");
    h.mean = init->mean;
    h.inv_std = init->inv_std;
    h.params = init->params;
    return h;
  }
  // Column means and variances in double: partial sums over fixed chunks of rows (the threads
  // share out the chunks), added up in chunk order, so the sums do not depend on the threads.
  constexpr int64_t kChunkRows = 512;
  const int64_t chunks = (n + kChunkRows - 1) / kChunkRows;
  std::vector<double> part(static_cast<size_t>(chunks * 2 * dim), 0.0);
#pragma omp parallel for schedule(static) if (n * dim >= kParallelValues)
  for (int64_t c = 0; c < chunks; ++c) {
    double* a = part.data() + c * 2 * dim;
    double* q = a + dim;
    for (int64_t i = c * kChunkRows; i < std::min(n, (c + 1) * kChunkRows); ++i) {
      const float* xi = x + i * dim;
      for (int64_t j = 0; j < dim; ++j) {
        const double v = xi[j];
        a[j] += v;
        q[j] += v * v;
      }
    }
  }
  std::vector<double> s1(static_cast<size_t>(dim), 0.0), s2(static_cast<size_t>(dim), 0.0);
  for (int64_t c = 0; c < chunks; ++c)
    for (int64_t j = 0; j < dim; ++j) {
      s1[static_cast<size_t>(j)] += part[static_cast<size_t>(c * 2 * dim + j)];
      s2[static_cast<size_t>(j)] += part[static_cast<size_t>(c * 2 * dim + dim + j)];
    }
  h.mean.assign(static_cast<size_t>(dim), 0.f);
  h.inv_std.assign(static_cast<size_t>(dim), 0.f);
  for (size_t j = 0; j < static_cast<size_t>(dim); ++j) {
    const double mu = s1[j] / static_cast<double>(n), var = std::max(s2[j] / static_cast<double>(n) - mu * mu, 0.0);
    h.mean[j] = static_cast<float>(mu);
    h.inv_std[j] = static_cast<float>(1.0 / std::sqrt(var + 1e-6));
  }
  auto layout = ParamLayout(cfg, dim, classes);
  h.params.assign(ParamCount(layout), 0.f);
  std::mt19937_64 rng(cfg.seed);
  const int64_t fan_in[] = {dim, 0, cfg.hidden, 0};
  const int64_t fan_out[] = {cfg.type == "mlp" ? cfg.hidden : classes, 0, classes, 0};
  for (size_t k = 0; k < layout.size(); k += 2) {  // Glorot uniform for weights, zeros for biases
    float lim = std::sqrt(6.f / static_cast<float>(fan_in[k] + fan_out[k]));
    std::uniform_real_distribution<float> u(-lim, lim);
    for (size_t i = 0; i < layout[k].size; ++i) h.params[layout[k].offset + i] = u(rng);
  }
  return h;
}

GradientKernel::GradientKernel(const Head& h, int64_t max_rows)
    : batch_(std::make_unique<HeadBatch>(std::vector<const Head*>{&h}, max_rows)) {}

GradientKernel::~GradientKernel() = default;

double GradientKernel::Accumulate(const Head& h, const float* x, const uint8_t* y, int64_t b, float scale, float* grad,
                                  int64_t* correct, float* dx) {
  double loss = 0;
  batch_->Accumulate(h.params.data(), x, y, b, scale, grad, &loss, correct, dx);
  return loss;
}

Optimizer::Optimizer(const HeadConfig& cfg, const std::vector<ParamBlock>& layout, size_t lo, size_t hi, float momentum)
    : cfg_(cfg), lo_(lo), momentum_(momentum), m_(hi - lo, 0.f), v_(hi - lo, 0.f) {
  // The slice as runs of equal decay: the blocks it overlaps, and plain parameters between them.
  std::vector<uint8_t> decay(hi - lo, 0);
  for (const auto& b : layout)
    for (size_t i = std::max(b.offset, lo); i < std::min(b.offset + b.size, hi); ++i) decay[i - lo] = b.decay;
  for (size_t i = 0; i < decay.size();) {
    size_t e = i;
    while (e < decay.size() && decay[e] == decay[i]) ++e;
    runs_.push_back({i, e, decay[i] != 0});
    i = e;
  }
}

namespace {

// The update loops, without branches so that the compiler vectorises them.
// Adam's step with its bias corrections folded into two constants (as PyTorch's): one division
// and one square root per parameter.
void AdamRun(float* p, const float* g, float* m, float* v, size_t n, float l2, float b1, float b2, float step,
             float inv_sqrt_c2) {
  for (size_t i = 0; i < n; ++i) {
    const float gi = g[i] + l2 * p[i];
    m[i] = b1 * m[i] + (1 - b1) * gi;
    v[i] = b2 * v[i] + (1 - b2) * gi * gi;
    p[i] -= step * m[i] / (std::sqrt(v[i]) * inv_sqrt_c2 + 1e-8f);
  }
}

void MomentumRun(float* p, const float* g, float* m, size_t n, float l2, float momentum, float lr) {
  for (size_t i = 0; i < n; ++i) {
    m[i] = momentum * m[i] + (g[i] + l2 * p[i]);
    p[i] -= lr * m[i];
  }
}

}  // namespace

void Optimizer::Step(float* p, const float* g) {
  ++t_;
  const float lr = static_cast<float>(cfg_.lr), l2 = static_cast<float>(cfg_.l2);
  const float b1 = momentum_, b2 = 0.999f;
  const float c1 = 1.f - std::pow(b1, static_cast<float>(t_)), c2 = 1.f - std::pow(b2, static_cast<float>(t_));
  const bool adam = cfg_.optimizer == "adam";
  for (const Run& r : runs_) {
    const size_t n = r.end - r.begin;
    const float decay = r.decay ? l2 : 0.f;
    if (adam)
      AdamRun(p + r.begin, g + r.begin, &m_[r.begin], &v_[r.begin], n, decay, b1, b2, lr / c1, 1.f / std::sqrt(c2));
    else
      MomentumRun(p + r.begin, g + r.begin, &m_[r.begin], n, decay, momentum_, lr);
  }
}

}  // namespace msaflow::kernels
