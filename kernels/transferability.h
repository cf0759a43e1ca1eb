// How well a backbone's features suit a labelled dataset, estimated from the features alone,
// without training a head: what `msaflow rank` and the halving strategy's first rung rank
// backbones by (docs/search.md).
// - Leave-one-out k-nearest-neighbour accuracy: each image labelled by the vote of its k
//   nearest others (features standardised per dimension, Euclidean distance: candidates by a
//   float GEMM, the nearest k + 16 measured again in double).
// - LogME (You et al., ICML 2021): per class, the log marginal likelihood per image of a
//   Bayesian linear regression of the one-hot label on the features, its prior and noise
//   precisions (alpha, beta) at the evidence's maximum (MacKay's fixed point); the mean over
//   classes. Higher is better; comparable between backbones on one dataset, not across datasets.
#pragma once

#include <cstdint>
#include <vector>

namespace msaflow::kernels {

// The nearest-neighbour vote's size (ties go to the class whose voters lie nearer in sum).
inline constexpr int64_t kKnnNeighbours = 5;

// x: n rows of d features (row-major), labels[n] in 0..classes-1. n >= 2.
double KnnLooAccuracy(const float* x, int64_t n, int64_t d, const uint8_t* labels, int64_t k = kKnnNeighbours);

// x as above; the evidence of each class's one-hot column, averaged. Computed in double from
// the eigendecomposition of the smaller Gram matrix (d x d or n x n). Throws kInvalidInput for
// n < 2 or d < 1.
double LogMe(const float* x, int64_t n, int64_t d, const uint8_t* labels, int64_t classes);

// Rows of `labels` kept for a stratified subset: of each class's images (in order),
// max(min_per_class, round(fraction * count)) (at most all of them), chosen by a seeded shuffle,
// returned in ascending order. Deterministic for (labels, fraction, min_per_class, seed).
std::vector<int64_t> StratifiedSubset(const std::vector<uint8_t>& labels, double fraction, int64_t min_per_class,
                                      uint64_t seed);

// Kendall's tau-b between two rankings' scores (ties counted as neither concordant nor
// discordant, as scipy.stats.kendalltau does); 0 for fewer than two items or a constant side.
double KendallTau(const std::vector<double>& a, const std::vector<double>& b);

}  // namespace msaflow::kernels
