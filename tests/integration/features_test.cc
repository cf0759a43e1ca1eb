// Features from the C++ executor match an independent implementation (OpenCV dnn on the same
// ONNX file, cut by onnx.utils) within 1e-3 relative, for the real models (MobileNetV2, PP-OCRv4,
// InceptionV3), on real images.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <fstream>

#include "common/files.h"
#include "kernels/dataset.h"
#include "kernels/executor.h"
#include "kernels/onnx_graph.h"
#include "kernels/prepare.h"

namespace msaflow::kernels {
namespace {

const std::string kRoot = MSAFLOW_SOURCE_DIR;

void Check(const std::string& model, const std::string& cut, InputSpec spec, int64_t expect_dim) {
  ImageSet ds = ReadIdx(kRoot + "/data/fashion-mnist/t10k-images-idx3-ubyte.gz",
                        kRoot + "/data/fashion-mnist/t10k-labels-idx1-ubyte.gz", 6);
  const int64_t n = ds.count, c = spec.channels;
  std::vector<float> x(static_cast<size_t>(n * c * spec.height * spec.width));
  PrepareBatch(ds.pixels.data(), n, ds.rows, ds.cols, spec, x.data());
  Executor ex(ImportOnnx(ReadFile(kRoot + "/models/" + model), model, cut));
  std::vector<float> got = ex.Features(x.data(), n, c, spec.height, spec.width);
  ASSERT_EQ(got.size(), static_cast<size_t>(n * expect_dim));

  std::string in = "/tmp/msaflow-ft-" + std::to_string(::getpid()) + ".in", out = in + ".out";
  {
    std::ofstream f(in, std::ios::binary);
    f.write(reinterpret_cast<const char*>(x.data()), static_cast<std::streamsize>(x.size() * sizeof(float)));
  }
  const char* py = std::getenv("MSAFLOW_PYTHON");
  std::string cmd = std::string(py ? py : "/usr/bin/python3") + " " + kRoot + "/tests/python/ref_features.py " + kRoot +
                    "/models/" + model + " " + cut + " " + std::to_string(n) + " " + std::to_string(c) + " " +
                    std::to_string(spec.height) + " " + std::to_string(spec.width) + " " + in + " " + out;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::string ref_bytes = ReadFile(out);
  std::remove(in.c_str());
  std::remove(out.c_str());
  ASSERT_EQ(ref_bytes.size(), got.size() * sizeof(float));
  const float* ref = reinterpret_cast<const float*>(ref_bytes.data());
  double scale = 0, worst = 0;
  for (size_t i = 0; i < got.size(); ++i) scale = std::max(scale, std::fabs(static_cast<double>(ref[i])));
  ASSERT_GT(scale, 0);
  for (size_t i = 0; i < got.size(); ++i)
    worst = std::max(worst, std::fabs(static_cast<double>(got[i] - ref[i])) / scale);
  std::printf("%s @ %s: max relative error %.2e over %zu values\n", model.c_str(), cut.c_str(), worst, got.size());
  EXPECT_LT(worst, 1e-3);
}

TEST(Features, MobileNetV2MatchesOpenCV) {
  InputSpec s;
  s.height = s.width = 96;
  Check("mobilenet_v2.onnx", "block_13_expand_relu", s, 576);
}

TEST(Features, PPOCRv4MatchesOpenCV) {
  InputSpec s;
  s.height = s.width = 48;
  s.mean = {0.5f, 0.5f, 0.5f};
  s.std = {0.5f, 0.5f, 0.5f};
  Check("ch_PP-OCRv4_rec_infer.onnx", "p2o.AveragePool.1", s, 480);
}

// InceptionV3 (converted from nsfwjs): max pooling, "same" averages that leave the padding out,
// and the channel concatenations of its mixed blocks.
TEST(Features, InceptionV3MatchesOpenCV) {
  InputSpec s;
  s.height = s.width = 96;
  Check("inception_v3.onnx", "mixed5", s, 768);
}

// One model cut at several layers runs once for all of them (rank and prepare do so): each cut
// whose one pass computes it as the model cut there alone (CutsAsAlone) gives the very bits of
// the model cut there alone. PP-OCRv4's conv2d_195 is a convolution whose activation the deeper
// cut fuses into it: the pass computes the cut by a copy of the convolution without it.
void CheckCuts(const std::string& model, const std::vector<std::string>& cuts, InputSpec spec,
               const std::vector<bool>& as_alone) {
  ImageSet ds = ReadIdx(kRoot + "/data/fashion-mnist/t10k-images-idx3-ubyte.gz",
                        kRoot + "/data/fashion-mnist/t10k-labels-idx1-ubyte.gz", 40);
  const int64_t n = ds.count, c = spec.channels;
  std::vector<float> x(static_cast<size_t>(n * c * spec.height * spec.width));
  PrepareBatch(ds.pixels.data(), n, ds.rows, ds.cols, spec, x.data());
  const std::string bytes = ReadFile(kRoot + "/models/" + model);
  Executor pass(ImportOnnxCuts(bytes, model, cuts));
  EXPECT_EQ(pass.CutsAsAlone(c, spec.height, spec.width), as_alone);
  const auto all = pass.FeaturesOfCuts(x.data(), n, c, spec.height, spec.width);
  const auto dims = pass.FeatureDimsOfCuts(c, spec.height, spec.width);
  ASSERT_EQ(all.size(), cuts.size());
  ASSERT_EQ(dims.size(), cuts.size());
  EXPECT_EQ(pass.Features(x.data(), n, c, spec.height, spec.width), all[0]);  // the first cut's alone
  for (size_t k = 0; k < cuts.size(); ++k) {
    Executor alone(ImportOnnx(bytes, model, cuts[k]));
    const std::vector<float> want = alone.Features(x.data(), n, c, spec.height, spec.width);
    ASSERT_EQ(all[k].size(), want.size()) << cuts[k];
    EXPECT_EQ(dims[k], alone.FeatureDim(c, spec.height, spec.width)) << cuts[k];
    const bool same = std::memcmp(all[k].data(), want.data(), want.size() * sizeof(float)) == 0;
    if (as_alone[k]) {
      EXPECT_TRUE(same) << cuts[k];
    }
    double worst = 0, scale = 0;  // either way the same features, to rounding
    for (size_t i = 0; i < want.size(); ++i) {
      scale = std::max(scale, std::fabs(static_cast<double>(want[i])));
      worst = std::max(worst, std::fabs(static_cast<double>(all[k][i] - want[i])));
    }
    EXPECT_LE(worst, 1e-5 * scale) << cuts[k];
  }
}

TEST(Features, OnePassOfMobileNetV2GivesEachCutsOwnBits) {
  InputSpec s;
  s.height = s.width = 96;
  CheckCuts("mobilenet_v2.onnx", {"block_3_expand_relu", "block_13_expand_relu", "out_relu"}, s, {true, true, true});
  CheckCuts("mobilenet_v2.onnx", {"out_relu", "block_3_expand_relu"}, s, {true, true});
}

TEST(Features, OnePassOfPPOCRv4GivesEachCutsOwnBits) {
  InputSpec s;
  s.height = s.width = 48;
  s.mean = {0.5f, 0.5f, 0.5f};
  s.std = {0.5f, 0.5f, 0.5f};
  CheckCuts("ch_PP-OCRv4_rec_infer.onnx", {"conv2d_195.tmp_0", "p2o.AveragePool.1"}, s, {true, true});
  CheckCuts("ch_PP-OCRv4_rec_infer.onnx", {"p2o.AveragePool.1", "conv2d_195.tmp_0"}, s, {true, true});
}

TEST(Features, OnePassOfInceptionV3GivesEachCutsOwnBits) {
  InputSpec s;
  s.height = s.width = 96;
  CheckCuts("inception_v3.onnx", {"mixed2", "mixed5", "mixed7"}, s, {true, true, true});
}

}  // namespace
}  // namespace msaflow::kernels
