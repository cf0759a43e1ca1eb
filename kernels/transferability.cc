#include "kernels/transferability.h"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>

#include "common/error.h"
#include "kernels/gemm.h"

namespace msaflow::kernels {
namespace {

using Matrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

Matrix ToDouble(const float* x, int64_t n, int64_t d) {
  return Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>(x, n, d).cast<double>();
}

void CheckShape(const char* what, int64_t n, int64_t d) {
  if (n < 2 || d < 1)
    Throw(ErrorKind::kInvalidInput, std::string(what) + ": " + std::to_string(n) + " images of " + std::to_string(d) +
                                        " features; expected at least 2 images and 1 feature");
}

// One class's evidence, given the Gram eigenvalues s (k of them, the rest of the d are zero)
// and the label column's squared projections x2 on the matching left singular vectors (res:
// what of |y|^2 lies outside them). MacKay's fixed point on t = alpha / beta.
double ClassEvidence(const Eigen::VectorXd& s, const Eigen::VectorXd& x2, double res, int64_t n, int64_t d) {
  constexpr double kEps = 1e-12;
  constexpr int kMaxIterations = 100;
  double alpha = 1, beta = 1, m2 = 0, res2 = 0;
  for (int it = 0; it < kMaxIterations; ++it) {
    const double t = alpha / beta;
    const Eigen::ArrayXd st = s.array() + t;
    const double gamma = (s.array() / st).sum();
    m2 = (s.array() * x2.array() / st.square()).sum();
    res2 = (x2.array() * (t / st).square()).sum() + res;
    alpha = gamma / (m2 + kEps);
    beta = (static_cast<double>(n) - gamma) / (res2 + kEps);
    if (std::abs(alpha / beta - t) <= 1e-10 * t) break;
  }
  // With m and the residual at the last (alpha, beta): the evidence of that pair.
  const double t = alpha / beta;
  const Eigen::ArrayXd st = s.array() + t;
  m2 = (s.array() * x2.array() / st.square()).sum();
  res2 = (x2.array() * (t / st).square()).sum() + res;
  const double log_det = (alpha + beta * s.array()).log().sum() + static_cast<double>(d - s.size()) * std::log(alpha);
  const double ev = 0.5 * static_cast<double>(d) * std::log(alpha) + 0.5 * static_cast<double>(n) * std::log(beta) -
                    0.5 * log_det - 0.5 * beta * res2 - 0.5 * alpha * m2 -
                    0.5 * static_cast<double>(n) * std::log(2 * M_PI);
  return ev / static_cast<double>(n);
}

// Image i's vote among its k nearest (`dist`, nearest first): most votes; then the nearer
// voters in sum; then the lower class. Counts a correct one in *correct.
void Vote(const std::vector<std::pair<double, int64_t>>& dist, int64_t k, const uint8_t* labels, int64_t i,
          std::map<int, std::pair<int64_t, double>>* votes, int64_t* correct) {
  votes->clear();
  for (int64_t r = 0; r < k; ++r) {
    auto& v = (*votes)[labels[dist[static_cast<size_t>(r)].second]];
    v.first += 1;
    v.second += dist[static_cast<size_t>(r)].first;
  }
  auto best = votes->begin();
  for (auto it = votes->begin(); it != votes->end(); ++it)
    if (it->second.first > best->second.first ||
        (it->second.first == best->second.first && it->second.second < best->second.second))
      best = it;
  if (best->first == labels[i]) ++*correct;
}

}  // namespace

double KnnLooAccuracy(const float* x, int64_t n, int64_t d, const uint8_t* labels, int64_t k) {
  CheckShape("kNN", n, d);
  k = std::clamp<int64_t>(k, 1, n - 1);
  Matrix f = ToDouble(x, n, d);
  // Standardised per dimension (a constant dimension contributes nothing).
  const Eigen::RowVectorXd mean = f.colwise().mean();
  f.rowwise() -= mean;
  Eigen::RowVectorXd sd = (f.array().square().colwise().sum() / static_cast<double>(n)).sqrt();
  for (int64_t j = 0; j < d; ++j) sd[j] = sd[j] > 0 ? 1 / sd[j] : 0;
  f = f.array().rowwise() * sd.array();
  // Candidates from float distances (oneDNN's sgemm on a block of rows at a time, all cores),
  // then the exact double distances of the nearest k + kMargin of them, ordered by (distance,
  // index): the neighbours all-double arithmetic finds, unless float rounding moved a true one
  // past the margin.
  constexpr int64_t kMargin = 16, kBlock = 256;
  const int64_t m = std::min(n - 1, k + kMargin);
  const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> z = f.cast<float>();
  std::vector<float> sq(static_cast<size_t>(n)), g(static_cast<size_t>(std::min(n, kBlock) * n));
  for (int64_t i = 0; i < n; ++i) sq[static_cast<size_t>(i)] = z.row(i).squaredNorm();
  int64_t correct = 0;
  std::vector<std::pair<float, int64_t>> approx(static_cast<size_t>(n - 1));
  std::vector<std::pair<double, int64_t>> dist(static_cast<size_t>(m));
  std::map<int, std::pair<int64_t, double>> votes;  // class -> (votes, summed distance)
  for (int64_t lo = 0; lo < n; lo += kBlock) {
    const int64_t rows = std::min(kBlock, n - lo);
    Gemm(false, true, rows, n, d, 1.f, z.data() + lo * d, d, z.data(), d, 0.f, g.data(), n);
    for (int64_t i = lo; i < lo + rows; ++i) {
      const float* gi = g.data() + (i - lo) * n;
      size_t c = 0;
      for (int64_t j = 0; j < n; ++j)
        if (j != i) approx[c++] = {sq[static_cast<size_t>(i)] + sq[static_cast<size_t>(j)] - 2 * gi[j], j};
      std::partial_sort(approx.begin(), approx.begin() + m, approx.end());
      for (int64_t r = 0; r < m; ++r) {
        const int64_t j = approx[static_cast<size_t>(r)].second;
        dist[static_cast<size_t>(r)] = {(f.row(i) - f.row(j)).squaredNorm(), j};
      }
      std::sort(dist.begin(), dist.end());  // by distance, then index
      Vote(dist, k, labels, i, &votes, &correct);
    }
  }
  return static_cast<double>(correct) / static_cast<double>(n);
}

double LogMe(const float* x, int64_t n, int64_t d, const uint8_t* labels, int64_t classes) {
  CheckShape("LogME", n, d);
  const Matrix f = ToDouble(x, n, d);
  // F = U S V^T; only the k = min(n, d) singular values and U's columns for them matter. From
  // the smaller Gram matrix: F F^T = U S^2 U^T directly, or F^T F = V S^2 V^T and u = F v / sigma.
  const bool by_features = n >= d;
  Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> es(by_features ? Eigen::MatrixXd(f.transpose() * f)
                                                                 : Eigen::MatrixXd(f * f.transpose()));
  const Eigen::VectorXd& s = es.eigenvalues();
  // Rounding leaves tiny negative or near-zero eigenvalues: those directions carry nothing.
  const double floor = std::max(s.maxCoeff(), 0.0) * 1e-12;
  std::vector<Eigen::Index> keep;
  for (Eigen::Index i = 0; i < s.size(); ++i)
    if (s[i] > floor) keep.push_back(i);
  Eigen::VectorXd sk(static_cast<Eigen::Index>(keep.size()));
  Matrix u(static_cast<Eigen::Index>(keep.size()), n);  // unit left singular vectors, as rows
  for (size_t r = 0; r < keep.size(); ++r) {
    const auto i = keep[r], row = static_cast<Eigen::Index>(r);
    sk[row] = s[i];
    if (by_features)
      u.row(row) = (f * es.eigenvectors().col(i)).transpose() / std::sqrt(s[i]);
    else
      u.row(row) = es.eigenvectors().col(i).transpose();
  }
  double total = 0;
  for (int64_t c = 0; c < classes; ++c) {
    Eigen::VectorXd y(n);
    for (int64_t i = 0; i < n; ++i) y[i] = labels[i] == c ? 1.0 : 0.0;
    const Eigen::VectorXd proj_y = u * y;
    const Eigen::VectorXd x2 = proj_y.array().square();
    const double res = std::max(0.0, y.squaredNorm() - x2.sum());
    total += ClassEvidence(sk, x2, res, n, d);
  }
  return total / static_cast<double>(classes);
}

std::vector<int64_t> StratifiedSubset(const std::vector<uint8_t>& labels, double fraction, int64_t min_per_class,
                                      uint64_t seed) {
  std::map<int, std::vector<int64_t>> by_class;
  for (size_t i = 0; i < labels.size(); ++i) by_class[labels[i]].push_back(static_cast<int64_t>(i));
  std::vector<int64_t> out;
  for (auto& [label, idx] : by_class) {
    const auto count = static_cast<int64_t>(idx.size());
    const int64_t take =
        std::min(count, std::max(min_per_class, static_cast<int64_t>(std::llround(fraction * static_cast<double>(count)))));
    std::mt19937_64 rng(seed * 1000003u + static_cast<uint64_t>(label));
    for (size_t i = idx.size() - 1; i > 0; --i) std::swap(idx[i], idx[rng() % (i + 1)]);  // Fisher-Yates
    out.insert(out.end(), idx.begin(), idx.begin() + take);
  }
  std::sort(out.begin(), out.end());
  return out;
}

double KendallTau(const std::vector<double>& a, const std::vector<double>& b) {
  const size_t n = std::min(a.size(), b.size());
  double concordant = 0, discordant = 0, ties_a = 0, ties_b = 0, pairs = 0;
  for (size_t i = 0; i < n; ++i)
    for (size_t j = i + 1; j < n; ++j) {
      const double da = a[i] - a[j], db = b[i] - b[j];
      pairs += 1;
      if (da == 0) ties_a += 1;
      if (db == 0) ties_b += 1;
      if (da * db > 0) concordant += 1;
      if (da * db < 0) discordant += 1;
    }
  const double denom = std::sqrt((pairs - ties_a) * (pairs - ties_b));
  return denom > 0 ? (concordant - discordant) / denom : 0.0;
}

}  // namespace msaflow::kernels
