#include "kernels/head.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "common/error.h"

namespace msaflow::kernels {
namespace {

// y[n x m] = x[n x k] * w[k x m] + b[m]
void Dense(const float* x, int64_t n, int64_t k, const float* w, const float* b, int64_t m, float* y) {
  for (int64_t i = 0; i < n; ++i) {
    float* yi = y + i * m;
    std::memcpy(yi, b, static_cast<size_t>(m) * sizeof(float));
    const float* xi = x + i * k;
    for (int64_t p = 0; p < k; ++p) {
      float v = xi[p];
      if (v == 0.f) continue;
      const float* wp = w + p * m;
      for (int64_t j = 0; j < m; ++j) yi[j] += v * wp[j];
    }
  }
}

// Softmax in place; returns the summed cross-entropy of the rows and counts correct argmaxes.
double SoftmaxXent(float* z, int64_t n, int64_t m, const uint8_t* y, int64_t* correct) {
  double loss = 0;
  for (int64_t i = 0; i < n; ++i) {
    float* zi = z + i * m;
    float mx = *std::max_element(zi, zi + m);
    int64_t arg = std::max_element(zi, zi + m) - zi;
    if (arg == y[i]) ++*correct;
    double s = 0;
    for (int64_t j = 0; j < m; ++j) s += (zi[j] = std::exp(zi[j] - mx));
    for (int64_t j = 0; j < m; ++j) zi[j] = static_cast<float>(zi[j] / s);
    loss -= std::log(std::max(static_cast<double>(zi[y[i]]), 1e-12));
  }
  return loss;
}

struct Optimizer {
  HeadConfig cfg;
  std::vector<std::vector<float>> m, v;
  int64_t t = 0;
  void Step(std::vector<std::vector<float>>& params, const std::vector<std::vector<float>>& grads,
            const std::vector<bool>& decay) {
    if (m.empty()) {
      for (auto& p : params) {
        m.emplace_back(p.size(), 0.f);
        v.emplace_back(p.size(), 0.f);
      }
    }
    ++t;
    const float lr = static_cast<float>(cfg.lr), l2 = static_cast<float>(cfg.l2);
    const float b1 = 0.9f, b2 = 0.999f;
    const float c1 = 1.f - std::pow(b1, static_cast<float>(t)), c2 = 1.f - std::pow(b2, static_cast<float>(t));
    for (size_t k = 0; k < params.size(); ++k) {
      auto& p = params[k];
      const auto& g = grads[k];
      auto& mk = m[k];
      auto& vk = v[k];
      for (size_t i = 0; i < p.size(); ++i) {
        float gi = g[i] + (decay[k] ? l2 * p[i] : 0.f);
        if (cfg.optimizer == "adam") {
          mk[i] = b1 * mk[i] + (1 - b1) * gi;
          vk[i] = b2 * vk[i] + (1 - b2) * gi * gi;
          p[i] -= lr * (mk[i] / c1) / (std::sqrt(vk[i] / c2) + 1e-8f);
        } else {
          mk[i] = 0.9f * mk[i] + gi;
          p[i] -= lr * mk[i];
        }
      }
    }
  }
};

void Standardize(const float* x, int64_t n, int64_t dim, const Head& h, float* out) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < dim; ++j)
      out[i * dim + j] = (x[i * dim + j] - h.mean[static_cast<size_t>(j)]) * h.inv_std[static_cast<size_t>(j)];
}

}  // namespace

std::vector<float> Head::Logits(const float* x, int64_t n) const {
  std::vector<float> xs(static_cast<size_t>(n * in_dim));
  Standardize(x, n, in_dim, *this, xs.data());
  std::vector<float> out(static_cast<size_t>(n * classes));
  if (config.type == "softmax") {
    Dense(xs.data(), n, in_dim, params[0].data(), params[1].data(), classes, out.data());
  } else {
    std::vector<float> h(static_cast<size_t>(n * config.hidden));
    Dense(xs.data(), n, in_dim, params[0].data(), params[1].data(), config.hidden, h.data());
    for (auto& v : h) v = std::max(v, 0.f);
    Dense(h.data(), n, config.hidden, params[2].data(), params[3].data(), classes, out.data());
  }
  return out;
}

std::string Head::Serialize() const {
  std::string b;
  auto put = [&](const std::vector<float>& v) {
    b.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  };
  put(mean);
  put(inv_std);
  for (const auto& p : params) put(p);
  return b;
}

namespace {
std::vector<size_t> ParamSizes(const HeadConfig& cfg, int64_t in_dim, int64_t classes) {
  if (cfg.type == "softmax") return {static_cast<size_t>(in_dim * classes), static_cast<size_t>(classes)};
  return {static_cast<size_t>(in_dim * cfg.hidden), static_cast<size_t>(cfg.hidden),
          static_cast<size_t>(cfg.hidden * classes), static_cast<size_t>(classes)};
}
}  // namespace

Head Head::Deserialize(const HeadConfig& cfg, int64_t in_dim, int64_t classes, const std::string& bytes) {
  Head h;
  h.config = cfg;
  h.in_dim = in_dim;
  h.classes = classes;
  std::vector<size_t> sizes = {static_cast<size_t>(in_dim), static_cast<size_t>(in_dim)};
  for (size_t s : ParamSizes(cfg, in_dim, classes)) sizes.push_back(s);
  size_t total = std::accumulate(sizes.begin(), sizes.end(), size_t{0}) * sizeof(float);
  if (bytes.size() != total)
    Throw(ErrorKind::kCorrupt, "head weights: " + std::to_string(bytes.size()) + " bytes, expected " +
                                   std::to_string(total) + " for a " + cfg.type + " head " + std::to_string(in_dim) +
                                   "->" + std::to_string(classes));
  size_t off = 0;
  std::vector<std::vector<float>> all;
  for (size_t s : sizes) {
    std::vector<float> v(s);
    std::memcpy(v.data(), bytes.data() + off, s * sizeof(float));
    off += s * sizeof(float);
    all.push_back(std::move(v));
  }
  h.mean = std::move(all[0]);
  h.inv_std = std::move(all[1]);
  h.params.assign(std::make_move_iterator(all.begin() + 2), std::make_move_iterator(all.end()));
  return h;
}

Head TrainHead(const HeadConfig& cfg, const float* x, const uint8_t* y, int64_t n, int64_t dim, int64_t classes,
               const Head* init) {
  if (n <= 0 || dim <= 0 || classes < 2) Throw(ErrorKind::kInvalidInput, "train: need rows, features and >= 2 classes");
  if (cfg.type != "softmax" && cfg.type != "mlp") Throw(ErrorKind::kInvalidInput, "train: unknown head type " + cfg.type);
  if (cfg.type == "mlp" && cfg.hidden <= 0) Throw(ErrorKind::kInvalidInput, "train: mlp needs hidden > 0");
  if (cfg.batch <= 0 || cfg.epochs <= 0 || !(cfg.lr > 0)) Throw(ErrorKind::kInvalidInput, "train: batch, epochs and lr must be positive");
  Head h;
  h.config = cfg;
  h.in_dim = dim;
  h.classes = classes;
  std::mt19937_64 rng(cfg.seed);
  if (init) {
    if (init->in_dim != dim || init->classes != classes || init->config.type != cfg.type ||
        init->config.hidden != cfg.hidden)
      Throw(ErrorKind::kInvalidInput, "train: warm start from a head of another shape");
    h.mean = init->mean;
    h.inv_std = init->inv_std;
    h.params = init->params;
  } else {
    h.mean.assign(static_cast<size_t>(dim), 0.f);
    h.inv_std.assign(static_cast<size_t>(dim), 0.f);
    for (int64_t j = 0; j < dim; ++j) {
      double s = 0, s2 = 0;
      for (int64_t i = 0; i < n; ++i) {
        double v = x[i * dim + j];
        s += v;
        s2 += v * v;
      }
      double mu = s / static_cast<double>(n), var = std::max(s2 / static_cast<double>(n) - mu * mu, 0.0);
      h.mean[static_cast<size_t>(j)] = static_cast<float>(mu);
      h.inv_std[static_cast<size_t>(j)] = static_cast<float>(1.0 / std::sqrt(var + 1e-6));
    }
    std::vector<size_t> sizes = ParamSizes(cfg, dim, classes);
    std::vector<int64_t> fan_in = {dim, 0, cfg.hidden, 0};
    std::vector<int64_t> fan_out = {cfg.type == "mlp" ? cfg.hidden : classes, 0, classes, 0};
    for (size_t k = 0; k < sizes.size(); ++k) {
      std::vector<float> p(sizes[k], 0.f);
      if (k % 2 == 0) {  // Glorot uniform for weights, zeros for biases
        float lim = std::sqrt(6.f / static_cast<float>(fan_in[k] + fan_out[k]));
        std::uniform_real_distribution<float> u(-lim, lim);
        for (auto& v : p) v = u(rng);
      }
      h.params.push_back(std::move(p));
    }
  }
  std::vector<float> xs(static_cast<size_t>(n * dim));
  Standardize(x, n, dim, h, xs.data());

  const bool mlp = cfg.type == "mlp";
  const int64_t hid = cfg.hidden, B = cfg.batch;
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::vector<float> xb(static_cast<size_t>(B * dim)), hb(static_cast<size_t>(B * std::max<int64_t>(hid, 1)));
  std::vector<float> z(static_cast<size_t>(B * classes)), dh(static_cast<size_t>(B * std::max<int64_t>(hid, 1)));
  std::vector<uint8_t> yb(static_cast<size_t>(B));
  std::vector<std::vector<float>> grads;
  for (const auto& p : h.params) grads.emplace_back(p.size(), 0.f);
  std::vector<bool> decay = {true, false, true, false};
  Optimizer opt{cfg, {}, {}, 0};

  for (int64_t e = 0; e < cfg.epochs; ++e) {
    std::shuffle(order.begin(), order.end(), rng);
    double loss = 0;
    int64_t correct = 0;
    for (int64_t s = 0; s < n; s += B) {
      int64_t b = std::min(B, n - s);
      for (int64_t i = 0; i < b; ++i) {
        int64_t r = order[static_cast<size_t>(s + i)];
        std::memcpy(&xb[static_cast<size_t>(i * dim)], &xs[static_cast<size_t>(r * dim)], static_cast<size_t>(dim) * sizeof(float));
        yb[static_cast<size_t>(i)] = y[r];
      }
      const float* top_in = xb.data();
      int64_t top_dim = dim;
      size_t wk = 0;
      if (mlp) {
        Dense(xb.data(), b, dim, h.params[0].data(), h.params[1].data(), hid, hb.data());
        for (int64_t i = 0; i < b * hid; ++i) hb[static_cast<size_t>(i)] = std::max(hb[static_cast<size_t>(i)], 0.f);
        top_in = hb.data();
        top_dim = hid;
        wk = 2;
      }
      Dense(top_in, b, top_dim, h.params[wk].data(), h.params[wk + 1].data(), classes, z.data());
      loss += SoftmaxXent(z.data(), b, classes, yb.data(), &correct);
      // dL/dz = softmax - onehot, averaged over the batch.
      const float inv_b = 1.f / static_cast<float>(b);
      for (int64_t i = 0; i < b; ++i) {
        z[static_cast<size_t>(i * classes + yb[static_cast<size_t>(i)])] -= 1.f;
        for (int64_t j = 0; j < classes; ++j) z[static_cast<size_t>(i * classes + j)] *= inv_b;
      }
      for (auto& g : grads) std::fill(g.begin(), g.end(), 0.f);
      auto& gw = grads[wk];
      auto& gb = grads[wk + 1];
      for (int64_t i = 0; i < b; ++i) {
        const float* zi = &z[static_cast<size_t>(i * classes)];
        const float* ai = top_in + i * top_dim;
        for (int64_t p = 0; p < top_dim; ++p) {
          float a = ai[p];
          if (a == 0.f) continue;
          float* g = &gw[static_cast<size_t>(p * classes)];
          for (int64_t j = 0; j < classes; ++j) g[j] += a * zi[j];
        }
        for (int64_t j = 0; j < classes; ++j) gb[static_cast<size_t>(j)] += zi[j];
      }
      if (mlp) {
        const auto& w2 = h.params[2];
        for (int64_t i = 0; i < b; ++i) {
          for (int64_t p = 0; p < hid; ++p) {
            float acc = 0;
            if (hb[static_cast<size_t>(i * hid + p)] > 0.f)
              for (int64_t j = 0; j < classes; ++j)
                acc += w2[static_cast<size_t>(p * classes + j)] * z[static_cast<size_t>(i * classes + j)];
            dh[static_cast<size_t>(i * hid + p)] = acc;
          }
        }
        auto& g1 = grads[0];
        auto& gb1 = grads[1];
        for (int64_t i = 0; i < b; ++i) {
          const float* xi = &xb[static_cast<size_t>(i * dim)];
          const float* di = &dh[static_cast<size_t>(i * hid)];
          for (int64_t p = 0; p < dim; ++p) {
            float a = xi[p];
            float* g = &g1[static_cast<size_t>(p * hid)];
            for (int64_t j = 0; j < hid; ++j) g[j] += a * di[j];
          }
          for (int64_t j = 0; j < hid; ++j) gb1[static_cast<size_t>(j)] += di[j];
        }
      }
      opt.Step(h.params, grads, decay);
    }
    h.curve_loss.push_back(loss / static_cast<double>(n));
    h.curve_acc.push_back(static_cast<double>(correct) / static_cast<double>(n));
  }
  return h;
}

}  // namespace msaflow::kernels
