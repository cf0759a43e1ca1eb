// kernels/transferability.h against an independent NumPy reference (tests/python/
// transferability_reference.py: LogME from its dense definition, kNN by brute force), and the
// subset and Kendall tau on cases worked by hand.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "common/error.h"
#include "common/files.h"
#include "kernels/transferability.h"

namespace msaflow::kernels {
namespace {

struct Case {
  int64_t n, d, classes;
  std::vector<float> x;
  std::vector<uint8_t> y;
};

// Overlapping Gaussian blobs, one per class, with a constant dimension (standardised away).
Case Blobs(int64_t n, int64_t d, int64_t classes, double spread, uint64_t seed) {
  Case c{n, d, classes, std::vector<float>(static_cast<size_t>(n * d)), std::vector<uint8_t>(static_cast<size_t>(n))};
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> g(0, 1);
  std::vector<double> centres(static_cast<size_t>(classes * d));
  for (auto& v : centres) v = g(rng);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = i % classes;
    c.y[static_cast<size_t>(i)] = static_cast<uint8_t>(k);
    for (int64_t j = 0; j < d; ++j)
      c.x[static_cast<size_t>(i * d + j)] =
          j == 1 ? 3.f : static_cast<float>(centres[static_cast<size_t>(k * d + j)] + spread * g(rng));
  }
  return c;
}

nlohmann::json Reference(const Case& c, int64_t k) {
  const std::string dir = std::filesystem::temp_directory_path() / ("msaflow-transfer-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  WriteFileAtomic(dir + "/x.f32", std::string_view(reinterpret_cast<const char*>(c.x.data()), c.x.size() * 4));
  WriteFileAtomic(dir + "/y.u8", std::string_view(reinterpret_cast<const char*>(c.y.data()), c.y.size()));
  const std::string cmd = "/usr/bin/python3 " MSAFLOW_SOURCE_DIR "/tests/python/transferability_reference.py " + dir +
                          "/x.f32 " + dir + "/y.u8 " + std::to_string(c.n) + " " + std::to_string(c.d) + " " +
                          std::to_string(c.classes) + " " + std::to_string(k);
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  char buf[4096];
  for (size_t got; p && (got = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, got);
  const int rc = p ? ::pclose(p) : -1;
  std::filesystem::remove_all(dir);
  EXPECT_EQ(rc, 0) << cmd;
  return nlohmann::json::parse(out);
}

TEST(Transferability, LogMeAndKnnMatchTheNumPyReference) {
  // More images than features (the d x d Gram), fewer (the n x n one), and well separated.
  for (const Case& c : {Blobs(90, 12, 3, 1.0, 1), Blobs(30, 50, 3, 1.5, 2), Blobs(64, 6, 4, 0.3, 3)}) {
    const nlohmann::json ref = Reference(c, kKnnNeighbours);
    const double logme = LogMe(c.x.data(), c.n, c.d, c.y.data(), c.classes);
    const double knn = KnnLooAccuracy(c.x.data(), c.n, c.d, c.y.data());
    EXPECT_NEAR(logme, ref["logme"].get<double>(), 1e-7 * std::abs(ref["logme"].get<double>()))
        << c.n << " x " << c.d;
    EXPECT_DOUBLE_EQ(knn, ref["knn"].get<double>()) << c.n << " x " << c.d;
  }
}

TEST(Transferability, BetterSeparatedFeaturesScoreHigher) {
  const Case tight = Blobs(120, 10, 3, 0.3, 7), loose = Blobs(120, 10, 3, 3.0, 7);
  EXPECT_GT(LogMe(tight.x.data(), 120, 10, tight.y.data(), 3), LogMe(loose.x.data(), 120, 10, loose.y.data(), 3));
  EXPECT_GT(KnnLooAccuracy(tight.x.data(), 120, 10, tight.y.data()),
            KnnLooAccuracy(loose.x.data(), 120, 10, loose.y.data()));
  EXPECT_EQ(KnnLooAccuracy(tight.x.data(), 120, 10, tight.y.data()), 1.0);
}

TEST(Transferability, TooFewImagesAreRefused) {
  const float x[2] = {1, 2};
  const uint8_t y[1] = {0};
  EXPECT_THROW(LogMe(x, 1, 2, y, 1), Error);
  EXPECT_THROW(KnnLooAccuracy(x, 1, 2, y), Error);
}

TEST(Transferability, StratifiedSubsetKeepsEveryClass) {
  std::vector<uint8_t> labels;
  labels.reserve(200);
  for (int i = 0; i < 200; ++i) labels.push_back(static_cast<uint8_t>(i < 190 ? i % 2 : 2));  // class 2: 10 images
  const auto rows = StratifiedSubset(labels, 0.1, 5, 9);
  int per[3] = {0, 0, 0};
  for (int64_t r : rows) ++per[labels[static_cast<size_t>(r)]];
  EXPECT_EQ(per[0], 10);  // round(0.1 x 95)
  EXPECT_EQ(per[1], 10);
  EXPECT_EQ(per[2], 5);   // at least 5
  EXPECT_TRUE(std::is_sorted(rows.begin(), rows.end()));
  EXPECT_EQ(rows, StratifiedSubset(labels, 0.1, 5, 9));
  EXPECT_NE(rows, StratifiedSubset(labels, 0.1, 5, 10));
  EXPECT_EQ(StratifiedSubset(labels, 0.1, 500, 9).size(), labels.size());  // at most all of them
}

TEST(Transferability, KendallTauAsScipyComputesIt) {
  EXPECT_DOUBLE_EQ(KendallTau({1, 2, 3, 4}, {10, 20, 30, 40}), 1.0);
  EXPECT_DOUBLE_EQ(KendallTau({1, 2, 3, 4}, {4, 3, 2, 1}), -1.0);
  EXPECT_NEAR(KendallTau({1, 2, 3}, {1, 3, 2}), 1.0 / 3, 1e-15);
  // scipy.stats.kendalltau([1, 2, 2, 3], [1, 2, 3, 3]) = 0.8 (tau-b).
  EXPECT_NEAR(KendallTau({1, 2, 2, 3}, {1, 2, 3, 3}), 0.8, 1e-15);
  EXPECT_EQ(KendallTau({1}, {1}), 0.0);
}

}  // namespace
}  // namespace msaflow::kernels
