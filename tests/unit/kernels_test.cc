#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>
#include <sys/resource.h>
#include <unistd.h>
#include <omp.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <random>

#include "common/error.h"
#include "common/files.h"
#include "kernels/dataset.h"
#include "kernels/executor.h"
#include "kernels/fold.h"
#include "kernels/half.h"
#include "kernels/head.h"
#include "kernels/head_batch.h"
#include "kernels/lbfgs.h"
#include "parallel/sync_batches.h"
#include "parallel/train.h"
#include "kernels/metrics.h"
#include "kernels/onnx_graph.h"
#include "kernels/prepare.h"

namespace msaflow::kernels {
namespace {

std::string TempPath(const std::string& name) {
  return "/tmp/msaflow-kt-" + std::to_string(::getpid()) + "-" + name;
}

std::string ErrorOf(const std::function<void()>& f, ErrorKind* kind = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    if (kind) *kind = e.kind();
    return e.what();
  }
  return "(no error)";
}

// ---- IDX -------------------------------------------------------------------------------------

TEST(Idx, RoundTripAndLimit) {
  std::vector<uint8_t> px(5 * 4 * 3), lab = {0, 1, 2, 1, 0};
  for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<uint8_t>(i);
  std::string ip = TempPath("img"), lp = TempPath("lab");
  WriteIdxImages(ip, 5, 4, 3, px.data());
  WriteIdxLabels(lp, 5, lab.data());
  ImageSet s = ReadIdx(ip, lp, 3);
  EXPECT_EQ(s.count, 3);
  EXPECT_EQ(s.rows, 4);
  EXPECT_EQ(s.cols, 3);
  EXPECT_EQ(s.pixels.size(), 36u);
  EXPECT_EQ(s.pixels[35], 35);
  EXPECT_EQ(s.classes(), 3);
  EXPECT_NE(s.Digest(), ReadIdx(ip, lp, 0).Digest());
  std::remove(ip.c_str());
  std::remove(lp.c_str());
}

TEST(Idx, WrongMagicAndShortBody) {
  std::vector<uint8_t> px(2 * 2 * 2, 7), lab = {1, 0};
  std::string ip = TempPath("img2"), lp = TempPath("lab2");
  std::vector<uint8_t> many(8, 1);
  WriteIdxLabels(ip, 8, many.data());  // a label file (16 bytes) where images are expected
  WriteIdxLabels(lp, 2, lab.data());
  ErrorKind k;
  EXPECT_EQ(ErrorOf([&] { ReadIdx(ip, lp, 0); }, &k),
            ip + ": magic 0x00000801, expected 0x00000803 (IDX unsigned-byte images, 3 dims)");
  EXPECT_EQ(k, ErrorKind::kInvalidInput);
  WriteIdxImages(ip, 2, 2, 2, px.data());
  std::string body = ReadFile(ip);
  WriteFileAtomic(ip, body.substr(0, body.size() - 3));
  EXPECT_EQ(ErrorOf([&] { ReadIdx(ip, lp, 0); }),
            ip + ": body has 5 bytes, header says 2 images of 2x2 = 8 bytes");
  EXPECT_EQ(ErrorOf([&] { ReadIdx(ip + ".missing", lp, 0); }, &k), ip + ".missing: no such file");
  EXPECT_EQ(k, ErrorKind::kNotFound);
  std::remove(ip.c_str());
  std::remove(lp.c_str());
}

// A dataset with a limit is read only as far as the images it takes: the gzip stream is
// decompressed no further (60,000 Fashion-MNIST images for a 10,000-image run cost a third of
// a second per read otherwise), and a body cut short after them is not an error; one cut short
// before them still is, named with what the limit needs.
TEST(Idx, ALimitReadsOnlyTheImagesItTakes) {
  std::vector<uint8_t> px(3 * 2 * 2), lab = {1, 0, 2};
  for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<uint8_t>(10 + i);
  std::string ip = TempPath("img3"), lp = TempPath("lab3"), gp = TempPath("img3.gz");
  WriteIdxImages(ip, 3, 2, 2, px.data());
  WriteIdxLabels(lp, 3, lab.data());
  const std::string body = ReadFile(ip);
  gzFile g = gzopen(gp.c_str(), "wb");
  ASSERT_NE(g, nullptr);
  ASSERT_EQ(gzwrite(g, body.data(), static_cast<unsigned>(body.size())), static_cast<int>(body.size()));
  ASSERT_EQ(gzclose(g), Z_OK);
  const ImageSet all = ReadIdx(ip, lp, 0), two = ReadIdx(gp, lp, 2);
  EXPECT_EQ(two.count, 2);
  EXPECT_EQ(two.pixels, std::vector<uint8_t>(px.begin(), px.begin() + 8));
  EXPECT_EQ(two.labels, std::vector<uint8_t>(lab.begin(), lab.begin() + 2));
  EXPECT_EQ(ReadIdx(gp, lp, 0).Digest(), all.Digest());
  WriteFileAtomic(ip, body.substr(0, body.size() - 3));  // the third image cut short
  EXPECT_EQ(ReadIdx(ip, lp, 2).pixels, two.pixels);
  EXPECT_EQ(ErrorOf([&] { ReadIdx(ip, lp, 3); }), ip + ": body has 9 bytes, header says 3 images of 2x2 = 12 bytes");
  WriteFileAtomic(ip, body.substr(0, body.size() - 6));  // the second one too
  EXPECT_EQ(ErrorOf([&] { ReadIdx(ip, lp, 2); }),
            ip + ": body has 6 bytes, the first 2 images (the limit) need 8 (header says 3 images of 2x2)");
  for (const auto& p : {ip, lp, gp}) std::remove(p.c_str());
}

// ---- preparation -------------------------------------------------------------------------------

TEST(Prepare, SameSizeIsIdentityAndNormalises) {
  std::vector<uint8_t> px = {0, 255, 51, 102};
  InputSpec spec;
  spec.height = 2;
  spec.width = 2;
  spec.channels = 3;
  spec.mean = {0.5f, 0.5f, 0.5f};
  spec.std = {0.5f, 0.5f, 0.5f};
  std::vector<float> out(12);
  PrepareBatch(px.data(), 1, 2, 2, spec, out.data());
  EXPECT_FLOAT_EQ(out[0], -1.f);
  EXPECT_FLOAT_EQ(out[1], 1.f);
  EXPECT_NEAR(out[2], (0.2f - 0.5f) / 0.5f, 1e-6);
  EXPECT_FLOAT_EQ(out[4], out[0]);  // channels replicated
  EXPECT_FLOAT_EQ(out[11], out[3]);
}

TEST(Prepare, UpsamplesBilinearly) {
  std::vector<uint8_t> px = {0, 255};  // 1x2
  InputSpec spec;
  spec.height = 1;
  spec.width = 4;
  spec.channels = 1;
  std::vector<float> out(4);
  PrepareBatch(px.data(), 1, 1, 2, spec, out.data());
  // Half-pixel centres: x_src = (x + 0.5) / 2 - 0.5 -> -0.25(clamped 0), 0.25, 0.75, 1.25(clamped)
  EXPECT_FLOAT_EQ(out[0], 0.f);
  EXPECT_NEAR(out[1], 0.25f, 1e-6);
  EXPECT_NEAR(out[2], 0.75f, 1e-6);
  EXPECT_FLOAT_EQ(out[3], 1.f);
}

// ---- ONNX import and executor ------------------------------------------------------------------

void AddConst(onnx::GraphProto* g, const std::string& name, const std::vector<int64_t>& dims, const std::vector<float>& v) {
  auto* t = g->add_initializer();
  t->set_name(name);
  t->set_data_type(onnx::TensorProto::FLOAT);
  for (auto d : dims) t->add_dims(d);
  for (float x : v) t->add_float_data(x);
}

onnx::NodeProto* AddNode(onnx::GraphProto* g, const std::string& op, std::vector<std::string> in, const std::string& out) {
  auto* n = g->add_node();
  n->set_op_type(op);
  n->set_name(out + "_node");
  for (auto& i : in) n->add_input(i);
  n->add_output(out);
  return n;
}

void IntsAttr(onnx::NodeProto* n, const std::string& name, std::vector<int64_t> v) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INTS);
  for (auto x : v) a->add_ints(x);
}

// A model whose graph has one input "x": N x 2 x H x W floats (opset 10).
onnx::GraphProto* TwoChannelModel(onnx::ModelProto& m) {
  m.set_ir_version(7);
  m.add_opset_import()->set_version(10);
  auto* g = m.mutable_graph();
  auto* in = g->add_input();
  in->set_name("x");
  auto* shape = in->mutable_type()->mutable_tensor_type()->mutable_shape();
  in->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  shape->add_dim()->set_dim_param("N");
  shape->add_dim()->set_dim_value(2);
  shape->add_dim()->set_dim_param("H");
  shape->add_dim()->set_dim_param("W");
  return g;
}

// conv(3x3, pad 1, 2->4 channels) -> clip(0,6) -> add(residual conv 1x1) -> relu
std::string SmallModel(const std::string& extra_op = "") {
  onnx::ModelProto m;
  auto* g = TwoChannelModel(m);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> w1(4 * 2 * 9), b1(4), w2(4 * 2);
  for (auto* v : {&w1, &b1, &w2})
    for (auto& x : *v) x = u(rng);
  AddConst(g, "w1", {4, 2, 3, 3}, w1);
  AddConst(g, "b1", {4}, b1);
  AddConst(g, "w2", {4, 2, 1, 1}, w2);
  auto* c1 = AddNode(g, "Conv", {"x", "w1", "b1"}, "c1");
  IntsAttr(c1, "pads", {1, 1, 1, 1});
  auto* clip = AddNode(g, "Clip", {"c1"}, "r1");
  auto* a = clip->add_attribute();
  a->set_name("min");
  a->set_type(onnx::AttributeProto::FLOAT);
  a->set_f(0);
  a = clip->add_attribute();
  a->set_name("max");
  a->set_type(onnx::AttributeProto::FLOAT);
  a->set_f(6);
  AddNode(g, "Conv", {"x", "w2"}, "c2");
  AddNode(g, "Add", {"r1", "c2"}, "sum");
  AddNode(g, extra_op.empty() ? "Relu" : extra_op, {"sum"}, "out");
  g->add_output()->set_name("out");
  std::string bytes;
  m.SerializeToString(&bytes);
  return bytes;
}

// The same network, naively, for one NCHW image.
std::vector<float> NaiveFeatures(const std::string& bytes, const std::vector<float>& x, int64_t h, int64_t w) {
  Graph g = ImportOnnx(bytes, "m", "out");
  const auto &w1 = g.consts["w1"].data, &b1 = g.consts["b1"].data, &w2 = g.consts["w2"].data;
  std::vector<float> feat(4, 0.f);
  for (int64_t o = 0; o < 4; ++o)
    for (int64_t y = 0; y < h; ++y)
      for (int64_t z = 0; z < w; ++z) {
        double c1 = b1[static_cast<size_t>(o)], c2 = 0;
        for (int64_t i = 0; i < 2; ++i) {
          for (int64_t ky = 0; ky < 3; ++ky)
            for (int64_t kx = 0; kx < 3; ++kx) {
              int64_t yy = y + ky - 1, zz = z + kx - 1;
              if (yy < 0 || zz < 0 || yy >= h || zz >= w) continue;
              c1 += w1[static_cast<size_t>(((o * 2 + i) * 3 + ky) * 3 + kx)] * x[static_cast<size_t>((i * h + yy) * w + zz)];
            }
          c2 += w2[static_cast<size_t>(o * 2 + i)] * x[static_cast<size_t>((i * h + y) * w + z)];
        }
        double v = std::min(std::max(c1, 0.0), 6.0) + c2;
        feat[static_cast<size_t>(o)] += static_cast<float>(std::max(v, 0.0));
      }
  for (auto& f : feat) f /= static_cast<float>(h * w);
  return feat;
}

// A tensor rounded through float16 (kernels::RoundThroughHalfAt: a Cast to FLOAT16 and one back,
// what a fine-tuned model reads where the run stored the maps as float16) is what the executor
// computes: each value rounded to nearest even; a float16 tensor read by anything but a Cast back
// is refused, naming it.
TEST(Executor, RunsACastToFloat16AndBackAsARounding) {
  onnx::ModelProto m;
  auto* g = TwoChannelModel(m);
  AddNode(g, "Relu", {"x"}, "r");
  AddNode(g, "GlobalAveragePool", {"r"}, "out");
  std::string plain;
  ASSERT_TRUE(m.SerializeToString(&plain));
  const std::string rounded = RoundThroughHalfAt(plain, "m", {"r"});
  onnx::ModelProto back;
  ASSERT_TRUE(back.ParseFromString(rounded));
  std::vector<std::string> ops;
  for (const auto& n : back.graph().node()) ops.push_back(n.op_type() + "(" + n.input(0) + ")");
  EXPECT_EQ(ops, (std::vector<std::string>{"Relu(x)", "Cast(r)", "Cast(msaflow.f16/r)",
                                           "GlobalAveragePool(msaflow.f16/r/rounded)"}));
  const int64_t h = 5, w = 3;
  std::vector<float> x(static_cast<size_t>(2 * h * w));
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1, 3);
  for (auto& v : x) v = u(rng);
  Executor ex(ImportOnnx(rounded, "m", "out")), unrounded(ImportOnnx(plain, "m", "out"));
  const std::vector<float> got = ex.Features(x.data(), 1, 2, h, w), raw = unrounded.Features(x.data(), 1, 2, h, w);
  for (int64_t c = 0; c < 2; ++c) {
    double want = 0, plain_mean = 0;
    for (int64_t i = 0; i < h * w; ++i) {
      const float r = std::max(x[static_cast<size_t>(c * h * w + i)], 0.f);
      want += HalfToFloatScalar(FloatToHalfScalar(r));
      plain_mean += r;
    }
    want /= static_cast<double>(h * w);
    plain_mean /= static_cast<double>(h * w);
    EXPECT_NEAR(got[static_cast<size_t>(c)], want, 1e-6) << c;
    EXPECT_NEAR(raw[static_cast<size_t>(c)], plain_mean, 1e-6) << c;
    EXPECT_GT(std::abs(want - plain_mean), 1e-5) << c;  // the rounding shows
  }
  // A float16 tensor computed on: refused, naming it.
  onnx::ModelProto m2;
  auto* g2 = TwoChannelModel(m2);
  AddNode(g2, "Relu", {"x"}, "r");
  auto* cast = AddNode(g2, "Cast", {"r"}, "h");
  auto* to = cast->add_attribute();
  to->set_name("to");
  to->set_type(onnx::AttributeProto::INT);
  to->set_i(onnx::TensorProto::FLOAT16);
  AddNode(g2, "GlobalAveragePool", {"h"}, "out");
  std::string bad;
  ASSERT_TRUE(m2.SerializeToString(&bad));
  ErrorKind kind;
  const std::string why = ErrorOf(
      [&] {
        Executor e(ImportOnnx(bad, "m", "out"));
        e.Features(x.data(), 1, 2, h, w);
      },
      &kind);
  EXPECT_EQ(kind, ErrorKind::kUnsupported);
  EXPECT_NE(why.find("input 'h' is float16"), std::string::npos) << why;
  EXPECT_EQ(ErrorOf([&] { RoundThroughHalfAt(plain, "m", {"nope"}); }, &kind), "m: no node computes tensor 'nope'");
}

TEST(Executor, MatchesNaiveImplementationForAnyBatchAndSize) {
  std::string bytes = SmallModel();
  Executor ex(ImportOnnx(bytes, "m", "out"));
  EXPECT_LT(ex.FusedOpCount(), 5u);  // clip, add and relu fused into the convolutions
  for (auto [n, h, w] : std::vector<std::array<int64_t, 3>>{{1, 5, 7}, {3, 8, 8}, {2, 1, 1}}) {
    std::vector<float> x(static_cast<size_t>(n * 2 * h * w));
    std::mt19937 rng(static_cast<unsigned>(n * 100 + h));
    std::uniform_real_distribution<float> u(-2, 2);
    for (auto& v : x) v = u(rng);
    auto got = ex.Features(x.data(), n, 2, h, w);
    ASSERT_EQ(got.size(), static_cast<size_t>(n * 4));
    for (int64_t i = 0; i < n; ++i) {
      std::vector<float> one(x.begin() + i * 2 * h * w, x.begin() + (i + 1) * 2 * h * w);
      auto want = NaiveFeatures(bytes, one, h, w);
      for (int64_t c = 0; c < 4; ++c)
        EXPECT_NEAR(got[static_cast<size_t>(i * 4 + c)], want[static_cast<size_t>(c)], 1e-4) << n << " " << h << " " << c;
    }
  }
}

// n values uniform in [-2, 2), from `seed`.
std::vector<float> UniformInput(int64_t n, unsigned seed) {
  std::vector<float> x(static_cast<size_t>(n));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-2, 2);
  for (auto& v : x) v = u(rng);
  return x;
}

// Reduced-precision features: as many as f32's, not all equal to them (the precision did
// change the arithmetic), and none further from them than `fraction` of the largest.
void ExpectNearButNotEqual(const std::vector<float>& want, const std::vector<float>& got, float fraction) {
  ASSERT_EQ(got.size(), want.size());
  float diff = 0, top = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    top = std::max(top, std::fabs(want[i]));
    diff = std::max(diff, std::fabs(got[i] - want[i]));
  }
  EXPECT_GT(diff, 0.f);
  EXPECT_LT(diff, fraction * top);
}

// bf16 keeps 8 bits of mantissa: the features of the same network agree with the naive f32
// ones to about 1 % (of the largest feature), where the CPU can run it.
// conv c1 (2->4) read by a relu (cut "r") and by a 1x1 conv (cut "y"): cut at "r" alone, the relu
// is fused into c1; in one pass with "y" it cannot be (c1 has two readers).
std::string BranchModel() {
  onnx::ModelProto m;
  auto* g = TwoChannelModel(m);
  std::mt19937 rng(4);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> w1(4 * 2 * 9), w2(3 * 4);
  for (auto* v : {&w1, &w2})
    for (auto& x : *v) x = u(rng);
  AddConst(g, "w1", {4, 2, 3, 3}, w1);
  AddConst(g, "w2", {3, 4, 1, 1}, w2);
  IntsAttr(AddNode(g, "Conv", {"x", "w1"}, "c1"), "pads", {1, 1, 1, 1});
  AddNode(g, "Relu", {"c1"}, "r");
  AddNode(g, "Conv", {"c1", "w2"}, "y");
  g->add_output()->set_name("y");
  std::string bytes;
  m.SerializeToString(&bytes);
  return bytes;
}

// One pass over several cuts of a model gives each cut the bits of the model cut there alone
// where CutsAsAlone says so: cuts whose activation or residual add the deeper cut fuses away
// (c1 before its clip, c2 before the add) are computed by copies of their convolutions. Where
// an extra reader keeps a fusion from happening ("r" beside "y"), CutsAsAlone says no.
TEST(Executor, OnePassOfSeveralCutsGivesEachCutsOwnBits) {
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> u(-2, 2);
  std::vector<float> x(3 * 2 * 7 * 5);
  for (auto& v : x) v = u(rng);
  auto check = [&](const std::string& bytes, const std::vector<std::string>& cuts, const std::vector<bool>& alone) {
    Executor pass(ImportOnnxCuts(bytes, "m", cuts));
    EXPECT_EQ(pass.CutsAsAlone(2, 7, 5), alone);
    const auto all = pass.FeaturesOfCuts(x.data(), 3, 2, 7, 5);
    ASSERT_EQ(all.size(), cuts.size());
    for (size_t k = 0; k < cuts.size(); ++k) {
      Executor one(ImportOnnx(bytes, "m", cuts[k]));
      const std::vector<float> want = one.Features(x.data(), 3, 2, 7, 5);
      if (alone[k]) {
        EXPECT_EQ(all[k], want) << cuts[k];
      } else {
        ASSERT_EQ(all[k].size(), want.size());
        for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(all[k][i], want[i], 1e-5f * (1 + std::fabs(want[i])));
      }
    }
  };
  check(SmallModel(), {"c1", "c2", "out"}, {true, true, true});
  check(SmallModel(), {"out", "r1"}, {true, true});
  check(BranchModel(), {"r", "y"}, {false, true});
  EXPECT_THROW(ImportOnnxCuts(SmallModel(), "m", {"out", "nope"}), Error);
}

TEST(Executor, Bf16FeaturesAgreeWithF32ToItsPrecision) {
  std::string why;
  if (!PrecisionAvailable(Precision::kBF16, &why)) {
    std::string bytes = SmallModel();
    EXPECT_EQ(ErrorOf([&] { Executor ex(ImportOnnx(bytes, "m", "out"), Precision::kBF16); }), "executor: " + why);
    GTEST_SKIP() << why;
  }
  std::string bytes = SmallModel();
  Executor f32(ImportOnnx(bytes, "m", "out")), bf16(ImportOnnx(bytes, "m", "out"), Precision::kBF16);
  const int64_t n = 4, h = 9, w = 9;
  const std::vector<float> x = UniformInput(n * 2 * h * w, 8);
  ExpectNearButNotEqual(f32.Features(x.data(), n, 2, h, w), bf16.Features(x.data(), n, 2, h, w), 0.02f);
  EXPECT_EQ(ParsePrecision("bf16"), Precision::kBF16);
  EXPECT_EQ(ErrorOf([] { ParsePrecision("fp8"); }), "precision 'fp8': expected \"f32\", \"bf16\" or \"int8\"");
}

// int8 with ranges calibrated on the inputs: features within a few per cent of f32 (8 bits at
// each of the two convolutions and the residual), bit-identical across runs and for ranges
// installed from an earlier calibration; nothing runs before there are ranges.
TEST(Executor, Int8FeaturesAgreeWithF32OnceCalibrated) {
  std::string why, bytes = SmallModel();
  if (!PrecisionAvailable(Precision::kInt8, &why)) {
    EXPECT_EQ(ErrorOf([&] { Executor ex(ImportOnnx(bytes, "m", "out"), Precision::kInt8); }), "executor: " + why);
    GTEST_SKIP() << why;
  }
  Executor f32(ImportOnnx(bytes, "m", "out")), int8(ImportOnnx(bytes, "m", "out"), Precision::kInt8);
  const int64_t n = 16, h = 9, w = 9;
  const std::vector<float> x = UniformInput(n * 2 * h * w, 9);
  EXPECT_EQ(ErrorOf([&] { int8.Features(x.data(), n, 2, h, w); }),
            "executor: int8 needs calibration ranges first (Calibrate or SetRanges)");
  int8.Calibrate(x.data(), n, 2, h, w);
  EXPECT_EQ(int8.ranges().size(), 3u);  // the input and the two convolutions' outputs
  EXPECT_NEAR(int8.ranges().at("x"), 2.f, 0.01f);
  const std::vector<float> got = int8.Features(x.data(), n, 2, h, w);
  ExpectNearButNotEqual(f32.Features(x.data(), n, 2, h, w), got, 0.03f);
  EXPECT_EQ(int8.Features(x.data(), n, 2, h, w), got);
  Executor again(ImportOnnx(bytes, "m", "out"), Precision::kInt8);
  again.SetRanges(int8.ranges());
  EXPECT_EQ(again.Features(x.data(), n, 2, h, w), got);
  // Ranges from another graph name tensors this one does not have.
  again.SetRanges({{"x", 2.f}});
  EXPECT_EQ(ErrorOf([&] { again.Features(x.data(), n, 2, h, w); }),
            "executor: int8: no calibration range for tensor 'r1' (ranges from another model or cut?)");
}

// Every half converts to the float it denotes and back to itself; floats round to the nearest
// half (ties to even), the F16C path and the scalar one bit for bit.
TEST(Half, RoundTripsEveryHalfAndRoundsFloatsToNearestEven) {
  std::vector<uint16_t> all(65536), back(65536);
  std::vector<float> wide(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  HalfToFloat(all.data(), wide.data(), all.size());
  FloatToHalf(wide.data(), back.data(), wide.size());
  for (uint32_t i = 0; i < 65536; ++i) {
    const bool nan = (i & 0x7c00u) == 0x7c00u && (i & 0x3ffu);
    if (nan) {
      EXPECT_TRUE(std::isnan(wide[i])) << i;
      continue;
    }
    ASSERT_EQ(back[i], all[i]) << i;
    ASSERT_EQ(HalfToFloatScalar(all[i]), wide[i]) << i;
  }
  EXPECT_EQ(wide[0x3c00], 1.f);
  EXPECT_EQ(wide[0x7bff], kHalfMax);
  EXPECT_EQ(wide[0x0001], std::ldexp(1.f, -24));  // the smallest subnormal
  // Ties go to the even half: 1 + 2^-11 lies halfway between 1 and 1 + 2^-10.
  EXPECT_EQ(FloatToHalfScalar(1.f + std::ldexp(1.f, -11)), 0x3c00);
  EXPECT_EQ(FloatToHalfScalar(1.f + 3 * std::ldexp(1.f, -11)), 0x3c02);
  EXPECT_EQ(FloatToHalfScalar(70000.f), 0x7c00);  // past the range: infinity
  std::mt19937 rng(4);
  std::uniform_real_distribution<float> mag(-30, 17);
  std::vector<float> x(10007);  // not a multiple of the vector width: the tail is scalar
  for (auto& v : x) v = std::ldexp(1.f, static_cast<int>(mag(rng))) * (rng() % 2 ? 1.f : -1.f) * (1.f + (rng() % 1000) / 999.f);
  std::vector<uint16_t> h(x.size());
  FloatToHalf(x.data(), h.data(), x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(h[i], FloatToHalfScalar(x[i])) << x[i];
    const float r = HalfToFloatScalar(h[i]);
    if (std::fabs(x[i]) >= std::ldexp(1.f, -14) && std::fabs(x[i]) <= kHalfMax) {
      EXPECT_LE(std::fabs(r - x[i]), std::fabs(x[i]) * std::ldexp(1.f, -11)) << x[i];
    }
  }
}

TEST(Onnx, UnknownOperatorNamesNodeAndOp) {
  std::string bytes = SmallModel("FancyOp");
  ErrorKind k;
  std::string msg = ErrorOf([&] { ImportOnnx(bytes, "m.onnx", "out"); }, &k);
  EXPECT_EQ(k, ErrorKind::kUnsupported);
  EXPECT_EQ(msg.rfind("m.onnx: node 'out_node' (FancyOp): operator FancyOp is not supported by the msaflow executor", 0), 0u)
      << msg;
  // Cutting before the unsupported node works.
  EXPECT_NO_THROW(ImportOnnx(bytes, "m.onnx", "sum"));
}

// Issue 14: a graph with a cycle was reported as "tensor ... is neither produced, a constant
// nor a graph input".
TEST(Onnx, ACycleIsNamedAsOne) {
  onnx::ModelProto m;
  m.ParseFromString(SmallModel());
  auto* g = m.mutable_graph();
  // r1 = Clip(c1) becomes r1 = Clip(sum), and sum = Add(r1, c2): r1 -> sum -> r1.
  for (auto& n : *g->mutable_node())
    if (n.output(0) == "r1") n.set_input(0, "sum");
  std::string bytes;
  m.SerializeToString(&bytes);
  try {
    ImportOnnx(bytes, "cyclic.onnx", "out");
    FAIL() << "a cyclic graph was imported";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
    EXPECT_NE(std::string(e.what()).find("the graph has a cycle (sum -> r1 -> sum)"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("cyclic.onnx: node 'r1_node' (Clip)"), std::string::npos) << e.what();
  }
  // Out of order without a cycle: said so.
  m.ParseFromString(SmallModel());
  g = m.mutable_graph();
  g->mutable_node()->SwapElements(0, 1);  // Clip before the Conv producing its input
  m.SerializeToString(&bytes);
  try {
    ImportOnnx(bytes, "unsorted.onnx", "out");
    FAIL() << "an unsorted graph was imported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("reads 'c1' before the node producing it"), std::string::npos) << e.what();
  }
}

// Found by fuzz/onnx_fuzz.cc: an initializer whose dims claim 78 million values it does not
// hold was allocated (and zero-filled) before the count was checked; dims whose product
// overflows were undefined behaviour.
TEST(Onnx, TensorDimsCannotClaimMoreThanTheFileHolds) {
  for (const std::vector<int64_t>& dims :
       {std::vector<int64_t>{112, 97, 100, 115}, std::vector<int64_t>{int64_t{1} << 40, int64_t{1} << 40}}) {
    onnx::ModelProto m;
    m.ParseFromString(SmallModel());
    auto* t = m.mutable_graph()->add_initializer();
    t->set_name("huge");
    t->set_data_type(onnx::TensorProto::FLOAT);
    for (auto d : dims) t->add_dims(d);
    std::string bytes;
    m.SerializeToString(&bytes);
    rusage before{}, after{};
    getrusage(RUSAGE_SELF, &before);
    try {
      ImportOnnx(bytes, "huge.onnx", "out");
      FAIL() << "imported a tensor of dims it does not hold";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
      EXPECT_NE(std::string(e.what()).find("tensor 'huge'"), std::string::npos) << e.what();
    }
    // Refused without allocating: the 314 MB the first dims claim never became resident.
    getrusage(RUSAGE_SELF, &after);
    EXPECT_LT(after.ru_maxrss - before.ru_maxrss, 64 * 1024) << "KiB";
  }
}

TEST(Onnx, TruncatedFile) {
  std::string bytes = SmallModel();
  ErrorKind k;
  std::string msg = ErrorOf([&] { ImportOnnx(bytes.substr(0, bytes.size() / 2), "m.onnx", "out"); }, &k);
  EXPECT_EQ(k, ErrorKind::kInvalidInput);
  EXPECT_EQ(msg, "m.onnx: not a valid ONNX protobuf (truncated or not an ONNX file; " +
                     std::to_string(bytes.size() / 2) + " bytes read)");
  EXPECT_EQ(ErrorOf([&] { ImportOnnx("", "e.onnx", "out"); }), "e.onnx: empty file; expected an ONNX model");
}

TEST(Onnx, UnknownCutSuggestsAName) {
  ErrorKind k;
  EXPECT_EQ(ErrorOf([&] { ImportOnnx(SmallModel(), "m.onnx", "sun"); }, &k),
            "m.onnx: no tensor named 'sun' (the feature layer) — did you mean \"sum\"?");
  EXPECT_EQ(k, ErrorKind::kNotFound);
}

// The layers a person may cut at (the service's new-run form): those the executor computes, in
// the model's order; none after an operator it lacks; the model's input dims.
TEST(Onnx, CutLayersAreTheComputableOnes) {
  auto names = [](const ModelLayers& m) {
    std::vector<std::string> out;
    for (const auto& l : m.layers) out.push_back(l.name + ":" + l.op);
    for (const auto& l : m.layers) EXPECT_EQ(l.node, l.name + "_node");  // the test model names its nodes so
    return out;
  };
  const ModelLayers all = ListCutLayers(SmallModel(), "m.onnx");
  EXPECT_EQ(names(all), (std::vector<std::string>{"c1:Conv", "r1:Clip", "c2:Conv", "sum:Add", "out:Relu"}));
  EXPECT_EQ(all.suggested, "out");  // no global pooling: the last layer
  EXPECT_EQ(all.input_dims, (std::vector<int64_t>{-1, 2, -1, -1}));
  const ModelLayers fancy = ListCutLayers(SmallModel("FancyOp"), "m.onnx");
  EXPECT_EQ(names(fancy), (std::vector<std::string>{"c1:Conv", "r1:Clip", "c2:Conv", "sum:Add"}));
  EXPECT_EQ(fancy.suggested, "sum");
  const ModelLayers pooled = ListCutLayers(SmallModel("GlobalAveragePool"), "m.onnx");
  EXPECT_EQ(pooled.suggested, "sum");  // the input of the last global pooling
  EXPECT_EQ(ErrorOf([&] { ListCutLayers("", "e.onnx"); }), "e.onnx: empty file; expected an ONNX model");
}

TEST(Onnx, CutModelReimports) {
  std::string cut = CutOnnx(SmallModel(), "m", "sum");
  Graph g = ImportOnnx(cut, "cut", "sum");
  EXPECT_EQ(g.nodes.size(), 4u);
  EXPECT_EQ(g.input, "x");
  EXPECT_EQ(g.input_dims, (std::vector<int64_t>{-1, 2, -1, -1}));
}

// The shape arithmetic the executor folds, on the cases ONNX defines with care.
TEST(Fold, SlicesClampNegativeIndicesAndStepBackwards) {
  Node n;
  n.name = "s";
  n.op = "Slice";
  n.inputs = {"x", "starts", "ends", "axes", "steps"};
  std::map<std::string, ConstTensor> c;
  auto ints = [](std::vector<int64_t> v) {
    ConstTensor t;
    t.dims = {static_cast<int64_t>(v.size())};
    t.is_int = true;
    t.ints = v;
    for (int64_t x : v) t.data.push_back(static_cast<float>(x));
    return t;
  };
  KnownFn known = [&](const std::string& t) { return c.count(t) ? &c.at(t) : nullptr; };
  // Axis 1 from the end backwards, axis 0 from -3 to "infinity".
  c["starts"] = ints({-1, -3});
  c["ends"] = ints({std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()});
  c["axes"] = ints({1, 0});
  c["steps"] = ints({-2, 1});
  SliceSpec s = ResolveSlice(n, known, {5, 4});
  EXPECT_EQ(s.start, (TensorDims{2, 3}));
  EXPECT_EQ(s.step, (TensorDims{1, -2}));
  EXPECT_EQ(s.len, (TensorDims{3, 2}));  // rows 2, 3, 4; columns 3, 1
  c["steps"] = ints({0, 1});
  EXPECT_THROW(ResolveSlice(n, known, {5, 4}), Error);
}

TEST(Fold, ReshapeCopiesZerosAndInfersOneDim) {
  Node n;
  n.name = "r";
  n.op = "Reshape";
  n.inputs = {"x", "shape"};
  ConstTensor shape;
  shape.dims = {3};
  shape.is_int = true;
  shape.ints = {0, -1, 2};
  shape.data = {0, -1, 2};
  KnownFn known = [&](const std::string& t) { return t == "shape" ? &shape : nullptr; };
  EXPECT_EQ(ReshapedDims(n, known, {2, 3, 4}), (TensorDims{2, 6, 2}));
  shape.ints = {0, -1, 5};
  EXPECT_THROW(ReshapedDims(n, known, {2, 3, 4}), Error);  // 12 per row is no multiple of 5
  shape.ints = {-1, -1, 2};
  EXPECT_THROW(ReshapedDims(n, known, {2, 3, 4}), Error);
}

TEST(TensorOps, PadModesAndBroadcastStrides) {
  const float x[3] = {1, 2, 3};
  float out[7];
  PadCopy(x, {3}, {2, 2}, PadMode::kReflect, 0, out);
  EXPECT_EQ(std::vector<float>(out, out + 7), (std::vector<float>{3, 2, 1, 2, 3, 2, 1}));
  PadCopy(x, {3}, {2, 2}, PadMode::kEdge, 0, out);
  EXPECT_EQ(std::vector<float>(out, out + 7), (std::vector<float>{1, 1, 1, 2, 3, 3, 3}));
  PadCopy(x, {3}, {-1, 1}, PadMode::kConstant, 9, out);  // crop one at the start
  EXPECT_EQ(std::vector<float>(out, out + 3), (std::vector<float>{2, 3, 9}));
  bool ok;
  EXPECT_EQ(BroadcastDims({2, 1, 4}, {3, 1}, &ok), (TensorDims{2, 3, 4}));
  EXPECT_TRUE(ok);
  BroadcastDims({2, 3}, {4}, &ok);
  EXPECT_FALSE(ok);
  EXPECT_EQ(BroadcastStrides({3, 1}, {2, 3, 4}), (TensorDims{0, 1, 0}));
}

TEST(Executor, RejectsInputContradictingFixedDims) {
  Executor ex(ImportOnnx(SmallModel(), "m", "out"));
  std::vector<float> x(3 * 4 * 4);
  EXPECT_EQ(ErrorOf([&] { ex.Features(x.data(), 1, 3, 4, 4); }),
            "executor: input 'x' dim 1 is fixed at 2 by the model, got 3");
}

// ---- heads, metrics, selection -----------------------------------------------------------------

void Blobs(int64_t n, int64_t dim, int64_t classes, uint64_t seed, std::vector<float>* x, std::vector<uint8_t>* y) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> g(0, 1);
  x->resize(static_cast<size_t>(n * dim));
  y->resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    int64_t c = i % classes;
    (*y)[static_cast<size_t>(i)] = static_cast<uint8_t>(c);
    for (int64_t j = 0; j < dim; ++j)
      (*x)[static_cast<size_t>(i * dim + j)] = g(rng) + (j % classes == c ? 2.5f : 0.f) + 10.f;
  }
}

// One rank of sync training: plain minibatch training.
Head Train(const HeadConfig& cfg, const std::vector<float>& x, const std::vector<uint8_t>& y) {
  const int64_t n = static_cast<int64_t>(y.size()), dim = static_cast<int64_t>(x.size()) / n;
  Head h = InitHead(cfg, x.data(), y.data(), n, dim, 3);
  std::vector<float> xs(x.size());
  h.Standardize(x.data(), n, xs.data());
  parallel::SelfComm self;
  parallel::TrainSync(self, {xs.data(), y.data(), n}, &h);
  return h;
}

TEST(Head, RefusesLabelsOutOfRange) {
  std::vector<float> x(4 * 3, 1.f);
  std::vector<uint8_t> y = {0, 1, 2, 7};
  EXPECT_EQ(ErrorOf([&] { InitHead(HeadConfig{}, x.data(), y.data(), 4, 3, 3); }),
            "train: row 3 has label 7, expected 0..2");
}

TEST(Head, LearnsAndIsDeterministic) {
  std::vector<float> x, xt;
  std::vector<uint8_t> y, yt;
  Blobs(600, 12, 3, 1, &x, &y);
  Blobs(300, 12, 3, 2, &xt, &yt);
  for (std::string type : {"softmax", "mlp"}) {
    HeadConfig cfg;
    cfg.type = type;
    cfg.hidden = 16;
    cfg.epochs = 8;
    cfg.lr = 0.01;
    cfg.seed = 42;
    Head a = Train(cfg, x, y);
    Head b = Train(cfg, x, y);
    EXPECT_EQ(a.Serialize(), b.Serialize()) << type;
    ASSERT_EQ(a.curve.size(), 8u);
    EXPECT_LT(a.curve.back().loss, a.curve.front().loss) << type;
    EXPECT_EQ(a.curve.back().step, 8 * ((600 + 63) / 64));
    auto logits = a.Logits(xt.data(), 300);
    Metrics m = Evaluate(logits.data(), yt.data(), 300, 3);
    EXPECT_GT(m.accuracy(), 0.9) << type;
    cfg.seed = 43;
    EXPECT_NE(Train(cfg, x, y).Serialize(), a.Serialize());
    Head back = Head::Deserialize(a.config, 12, 3, a.Serialize());
    EXPECT_EQ(back.Logits(xt.data(), 5), a.Logits(xt.data(), 5));
    EXPECT_EQ(ErrorOf([&] { Head::Deserialize(a.config, 12, 3, a.Serialize().substr(4)); }).rfind("head weights: ", 0), 0u);
  }
}

// An evaluate farm's rank runs with fewer threads than one rank alone: its logits, and so its
// losses, must not depend on the thread count, nor on which rows share a call beyond its blocks.
TEST(Head, LogitsDoNotDependOnTheThreadCount) {
  const int64_t n = 1000, dim = 1280, classes = 10;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  std::vector<float> x(static_cast<size_t>(n * dim));
  for (auto& v : x) v = std::max(normal(rng), 0.f);  // post-ReLU features, as a backbone gives
  std::vector<uint8_t> y(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) y[static_cast<size_t>(i)] = static_cast<uint8_t>(i % classes);
  const int threads = omp_get_max_threads();
  for (std::string type : {"softmax", "mlp"}) {
    HeadConfig cfg;
    cfg.type = type;
    cfg.hidden = 128;
    const Head h = InitHead(cfg, x.data(), y.data(), n, dim, classes);
    omp_set_num_threads(1);
    const auto one = h.Logits(x.data(), n);
    omp_set_num_threads(2);
    const auto two = h.Logits(x.data(), n);
    omp_set_num_threads(threads);
    EXPECT_EQ(one, two) << type;
    const auto head = h.Logits(x.data(), 64), tail = h.Logits(x.data() + 64 * dim, n - 64);
    EXPECT_TRUE(std::equal(head.begin(), head.end(), one.begin())) << type;
    EXPECT_TRUE(std::equal(tail.begin(), tail.end(), one.begin() + 64 * classes)) << type;
  }
}

TEST(Lbfgs, MinimisesRosenbrocksValley) {
  std::vector<double> w = {-1.2, 1.0};
  auto f = [](const std::vector<double>& v, std::vector<double>& g) {
    const double a = v[0], b = v[1];
    g[0] = -2 * (1 - a) - 400 * a * (b - a * a);
    g[1] = 200 * (b - a * a);
    return (1 - a) * (1 - a) + 100 * (b - a * a) * (b - a * a);
  };
  LbfgsOptions opt;
  opt.max_iterations = 200;
  int calls = 0;
  const LbfgsResult r = MinimizeLbfgs(w, f, opt, [&](int k, double) { EXPECT_EQ(k, ++calls); });
  // Near the minimum f is ~1e-12: the relative-decrease test (scipy's ftol) may end it first.
  EXPECT_TRUE(r.stop == "converged" || r.stop == "no progress") << r.stop;
  EXPECT_NEAR(w[0], 1.0, 1e-5);
  EXPECT_NEAR(w[1], 1.0, 1e-5);
  EXPECT_LE(r.max_gradient, 1e-4);
  EXPECT_LT(r.f, 1e-10);
  EXPECT_LT(r.iterations, 100);
  EXPECT_EQ(calls, r.iterations);
}

// The regularised objective of a softmax head at its weights: mean cross-entropy + l2/2 |W|^2,
// and the largest component of its gradient; computed here, apart from the trainer.
std::pair<double, double> Objective(Head& h, const std::vector<float>& xs, const std::vector<uint8_t>& y) {
  const int64_t n = static_cast<int64_t>(y.size());
  GradientKernel k(h, n);
  std::vector<float> g(h.params.size(), 0.f);
  int64_t correct = 0;
  double f = k.Accumulate(h, xs.data(), y.data(), n, 1.f / static_cast<float>(n), g.data(), &correct) /
             static_cast<double>(n);
  double gmax = 0;
  for (const auto& blk : ParamLayout(h.config, h.in_dim, h.classes))
    for (size_t i = blk.offset; i < blk.offset + blk.size; ++i) {
      double gi = g[i];
      if (blk.decay) {
        f += 0.5 * h.config.l2 * h.params[i] * h.params[i];
        gi += h.config.l2 * h.params[i];
      }
      gmax = std::max(gmax, std::abs(gi));
    }
  return {f, gmax};
}

TEST(Head, LbfgsFindsTheRegularisedOptimumAndIsDeterministic) {
  std::vector<float> x, xt;
  std::vector<uint8_t> y, yt;
  Blobs(600, 12, 3, 1, &x, &y);
  Blobs(300, 12, 3, 2, &xt, &yt);
  HeadConfig cfg;
  cfg.optimizer = "lbfgs";
  cfg.l2 = 1e-2;
  cfg.epochs = 300;  // the iteration cap
  cfg.seed = 42;
  Head a = Train(cfg, x, y);
  EXPECT_EQ(Train(cfg, x, y).Serialize(), a.Serialize());
  ASSERT_FALSE(a.curve.empty());
  EXPECT_LT(a.curve.size(), 300u);  // it stopped before the cap
  for (size_t i = 1; i < a.curve.size(); ++i) EXPECT_EQ(a.curve[i].step, a.curve[i - 1].step + 1);
  std::vector<float> xs(x.size());
  a.Standardize(x.data(), 600, xs.data());
  const auto [f_lbfgs, g_lbfgs] = Objective(a, xs, y);
  EXPECT_LT(g_lbfgs, 1e-3);  // stationary, up to float32 weights
  // Adam on the same objective, many epochs: no lower.
  HeadConfig adam = cfg;
  adam.optimizer = "adam";
  adam.epochs = 60;
  adam.lr = 0.01;
  Head b = Train(adam, x, y);
  EXPECT_LE(f_lbfgs, Objective(b, xs, y).first + 1e-6);
  auto logits = a.Logits(xt.data(), 300);
  EXPECT_GT(Evaluate(logits.data(), yt.data(), 300, 3).accuracy(), 0.9);
}

// Four heads of different kinds on the same features: the ones a round's candidates make.
std::vector<Head> MixedHeads(const std::vector<float>& x, const std::vector<uint8_t>& y, int64_t dim, int64_t epochs) {
  const int64_t n = static_cast<int64_t>(y.size());
  std::vector<HeadConfig> cfgs(4);
  cfgs[0].lr = 1e-2;
  cfgs[1].optimizer = "sgd";
  cfgs[1].lr = 3e-2;
  cfgs[1].l2 = 1e-3;
  cfgs[2].type = "mlp";
  cfgs[2].hidden = 16;
  cfgs[2].lr = 3e-3;
  cfgs[3].type = "mlp";
  cfgs[3].hidden = 7;
  cfgs[3].lr = 1e-2;
  cfgs[3].l2 = 0;
  std::vector<Head> heads;
  for (size_t k = 0; k < cfgs.size(); ++k) {
    cfgs[k].epochs = epochs;
    cfgs[k].batch = 50;
    cfgs[k].seed = 100 + k;
    cfgs[k].data_seed = 9;
    heads.push_back(InitHead(cfgs[k], x.data(), y.data(), n, dim, 3));
  }
  return heads;
}

// `heads` side by side on n rows of x (standardised by the first head's statistics): the
// packed parameters and one Accumulate's gradient, losses and correct counts.
struct AccumulatedBatch {
  std::vector<float> xs, p, g;
  std::unique_ptr<HeadBatch> batch;
  std::vector<double> loss;
  std::vector<int64_t> correct;
};
AccumulatedBatch Accumulate(const std::vector<Head>& heads, const std::vector<float>& x, const std::vector<uint8_t>& y,
                            int64_t n, float scale) {
  AccumulatedBatch a;
  a.xs.resize(x.size());
  heads[0].Standardize(x.data(), n, a.xs.data());
  std::vector<const Head*> members;
  for (const Head& h : heads) members.push_back(&h);
  a.batch = std::make_unique<HeadBatch>(members, n);
  a.p.resize(a.batch->size());
  a.g.assign(a.batch->size(), 0.f);
  a.batch->Pack(members, a.p.data());
  a.loss.assign(heads.size(), 0.0);
  a.correct.assign(heads.size(), 0);
  a.batch->Accumulate(a.p.data(), a.xs.data(), y.data(), n, scale, a.g.data(), a.loss.data(), a.correct.data());
  return a;
}

TEST(HeadBatch, GradientOfEveryHeadIsItsOwnAndMatchesFiniteDifferences) {
  std::vector<float> x;
  std::vector<uint8_t> y;
  Blobs(40, 9, 3, 3, &x, &y);
  std::vector<Head> heads = MixedHeads(x, y, 9, 1);
  AccumulatedBatch a = Accumulate(heads, x, y, 40, 1.f);
  HeadBatch& batch = *a.batch;
  const std::vector<float>&xs = a.xs, &p = a.p, &g = a.g;
  const std::vector<double>& loss = a.loss;
  const std::vector<int64_t>& correct = a.correct;
  for (size_t k = 0; k < heads.size(); ++k) {
    // The head's own kernel (a batch of one, in Head::params order) gives the same gradient.
    GradientKernel one(heads[k], 40);
    std::vector<float> gk(heads[k].params.size(), 0.f);
    int64_t ck = 0;
    EXPECT_NEAR(one.Accumulate(heads[k], xs.data(), y.data(), 40, 1.f, gk.data(), &ck), loss[k], 1e-3 * loss[k]);
    EXPECT_EQ(ck, correct[k]);
    size_t from = 0;
    for (const ParamBlock& blk : batch.Blocks(k))
      for (size_t i = 0; i < blk.size; ++i, ++from) ASSERT_NEAR(g[blk.offset + i], gk[from], 1e-4) << k << " " << from;
    EXPECT_EQ(from, heads[k].params.size());
  }
  // Central differences of the summed loss on every 3rd parameter of the vector.
  auto total = [&](std::vector<float>& q) {
    std::vector<double> l(4, 0.0);
    std::vector<int64_t> c(4, 0);
    std::vector<float> scratch(q.size(), 0.f);
    batch.Accumulate(q.data(), xs.data(), y.data(), 40, 1.f, scratch.data(), l.data(), c.data());
    return l[0] + l[1] + l[2] + l[3];
  };
  int checked = 0;
  for (size_t i = 0; i < p.size(); i += 3) {
    std::vector<float> q = p;
    const float h = 1e-3f;
    q[i] = p[i] + h;
    double up = total(q);
    q[i] = p[i] - h;
    double down = total(q);
    double fd = (up - down) / (2.0 * h);
    EXPECT_NEAR(g[i], fd, 2e-2 * std::max(1.0, std::abs(fd))) << "parameter " << i;
    ++checked;
  }
  EXPECT_GT(checked, 100);
}

// The shapes of a real round (576 features, 10 classes; 4 softmax heads and 4 MLP-128 heads
// side by side, 552 first-layer columns): every head's share of the batch's gradient and loss
// is bit for bit what its own kernel computes. Not a tolerance: Adam turns last-bit
// differences of near-zero gradients into whole steps, and a single 552-wide GEMM (oneDNN's
// AVX2 sgemm blocks it differently from a 128-wide one) let an MLP head drift 0.2 in weight
// over 15 epochs on Fashion-MNIST features.
TEST(HeadBatch, ARoundsWideHeadsGetBitForBitTheGradientTheyGetAlone) {
  std::vector<float> x;
  std::vector<uint8_t> y;
  Blobs(64, 576, 10, 11, &x, &y);
  std::vector<Head> heads;
  for (int k = 0; k < 8; ++k) {
    HeadConfig cfg;
    cfg.type = k < 4 ? "softmax" : "mlp";
    cfg.hidden = k < 4 ? 0 : 128;
    cfg.seed = static_cast<uint64_t>(k + 1);
    heads.push_back(InitHead(cfg, x.data(), y.data(), 64, 576, 10));
  }
  const AccumulatedBatch a = Accumulate(heads, x, y, 64, 1.f / 64);
  for (size_t k = 0; k < heads.size(); ++k) {
    GradientKernel one(heads[k], 64);
    std::vector<float> gk(heads[k].params.size(), 0.f);
    int64_t ck = 0;
    EXPECT_EQ(one.Accumulate(heads[k], a.xs.data(), y.data(), 64, 1.f / 64, gk.data(), &ck), a.loss[k]) << "head " << k;
    EXPECT_EQ(ck, a.correct[k]);
    size_t from = 0, differ = 0;
    for (const ParamBlock& blk : a.batch->Blocks(k))
      for (size_t i = 0; i < blk.size; ++i, ++from) differ += a.g[blk.offset + i] != gk[from];
    EXPECT_EQ(differ, 0u) << "head " << k << ": gradient entries not bit for bit its own";
  }
}

TEST(HeadBatch, TrainingTogetherGivesEachHeadTheWeightsItGetsAlone) {
  std::vector<float> x;
  std::vector<uint8_t> y;
  Blobs(600, 40, 3, 4, &x, &y);
  std::vector<Head> together = MixedHeads(x, y, 40, 4), alone = MixedHeads(x, y, 40, 4);
  std::vector<float> xs(x.size());
  together[0].Standardize(x.data(), 600, xs.data());
  const parallel::TrainData data{xs.data(), y.data(), 600};
  parallel::SelfComm self;
  std::vector<Head*> members;
  for (Head& h : together) members.push_back(&h);
  const auto stats = parallel::TrainSyncTogether(self, data, members);
  ASSERT_EQ(stats.size(), 4u);
  for (size_t k = 0; k < alone.size(); ++k) {
    EXPECT_EQ(stats[k].together, 4);
    parallel::TrainSync(self, data, &alone[k]);
    ASSERT_EQ(alone[k].params.size(), together[k].params.size());
    float worst = 0;
    for (size_t i = 0; i < alone[k].params.size(); ++i)
      worst = std::max(worst, std::abs(alone[k].params[i] - together[k].params[i]));
    EXPECT_LE(worst, 1e-5f) << "head " << k;
    ASSERT_EQ(alone[k].curve.size(), 4u);
    for (size_t e = 0; e < 4; ++e) EXPECT_NEAR(alone[k].curve[e].loss, together[k].curve[e].loss, 1e-5);
    // And it learnt: the heads differ from one another and fit the blobs.
    EXPECT_GT(together[k].curve.back().accuracy, 0.9) << "head " << k;
  }
  EXPECT_NE(together[0].params, together[1].params);
}

// Sync training's batches: every epoch a fresh permutation of the rows, each batch shared out
// between the ranks without overlap, the same for a seed whoever gathers them.
TEST(SyncBatches, EveryEpochIsAPermutationSharedOutByTheRanks) {
  const int64_t n = 103, dim = 3, B = 16, epochs = 2;
  std::vector<float> x(static_cast<size_t>(n * dim));
  std::vector<uint8_t> y(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i * dim)] = static_cast<float>(i);  // a row's own number
  const parallel::TrainData data{x.data(), y.data(), n};
  const int ranks = 3;
  std::vector<parallel::SyncBatches> per_rank;
  for (int r = 0; r < ranks; ++r) per_rank.emplace_back(data, dim, B, epochs, 7, r, ranks);
  ASSERT_EQ(per_rank[0].steps(), epochs * 7);
  EXPECT_EQ(per_rank[0].max_rows(), 6);  // 16 rows over 3 ranks
  std::vector<std::vector<int64_t>> epoch_rows(epochs);
  for (int64_t t = 0; t < per_rank[0].steps(); ++t) {
    int64_t shared = 0;
    for (auto& b : per_rank) {
      b.Gather(t);
      for (int64_t i = 0; i < b.Rows(t); ++i)
        epoch_rows[static_cast<size_t>(t / 7)].push_back(static_cast<int64_t>(b.Buffer(t).x[static_cast<size_t>(i * dim)]));
      shared += b.Rows(t);
    }
    EXPECT_EQ(shared, per_rank[0].Whole(t)) << "step " << t;
    EXPECT_EQ(per_rank[0].Whole(t), t % 7 == 6 ? n - 6 * B : B);
  }
  for (auto rows : epoch_rows) {
    std::sort(rows.begin(), rows.end());
    std::vector<int64_t> all(static_cast<size_t>(n));
    std::iota(all.begin(), all.end(), 0);
    EXPECT_EQ(rows, all);
  }
  EXPECT_NE(epoch_rows[0], epoch_rows[1]);
  parallel::SyncBatches again(data, dim, B, epochs, 7, 0, ranks);
  EXPECT_EQ(ErrorOf([&] { again.Gather(1); }), "sync batches gathered out of order");
}

// The next batch is gathered on a spare thread while this one trains, and the feature
// statistics are summed by threads: none of it may change a bit of the weights.
TEST(TrainSync, OneThreadAndTwoGiveTheSameWeights) {
  std::vector<float> x;
  std::vector<uint8_t> y;
  Blobs(2000, 64, 3, 12, &x, &y);  // 128,000 values: the statistics' threads share them out
  const int threads = omp_get_max_threads();
  std::vector<std::vector<Head>> trained;
  for (int t : {1, 2}) {
    omp_set_num_threads(t);
    std::vector<Head> heads = MixedHeads(x, y, 64, 2);
    std::vector<float> xs(x.size());
    heads[0].Standardize(x.data(), 2000, xs.data());
    parallel::SelfComm self;
    for (Head& h : heads) parallel::TrainSync(self, {xs.data(), y.data(), 2000}, &h);
    trained.push_back(std::move(heads));
  }
  omp_set_num_threads(threads);
  for (size_t k = 0; k < trained[0].size(); ++k) {
    EXPECT_EQ(trained[0][k].mean, trained[1][k].mean) << "head " << k;
    EXPECT_EQ(trained[0][k].inv_std, trained[1][k].inv_std) << "head " << k;
    EXPECT_EQ(trained[0][k].params, trained[1][k].params) << "head " << k;
    EXPECT_GT(trained[0][k].curve.back().accuracy, 0.9) << "head " << k;
  }
}

// The train step hands training raw features and the heads' standardisation, and each row is
// standardised as it is read: the weights must be those of training on a standardised copy,
// bit for bit, for minibatch heads alone and together and for L-BFGS.
TEST(TrainData, RowsStandardisedAsTheyAreReadTrainTheSameWeights) {
  std::vector<float> x;
  std::vector<uint8_t> y;
  Blobs(1500, 24, 3, 21, &x, &y);
  const int64_t n = 1500;
  parallel::SelfComm self;
  auto both = [&](std::vector<Head> heads, bool together) {
    std::vector<Head> raw = heads;
    std::vector<float> xs(x.size());
    heads[0].Standardize(x.data(), n, xs.data());
    const parallel::TrainData copied{xs.data(), y.data(), n};
    const parallel::TrainData as_read{x.data(), y.data(), n, raw[0].mean.data(), raw[0].inv_std.data()};
    std::vector<Head*> a, b;
    for (size_t k = 0; k < heads.size(); ++k) {
      a.push_back(&heads[k]);
      b.push_back(&raw[k]);
    }
    if (together) {
      parallel::TrainSyncTogether(self, copied, a);
      parallel::TrainSyncTogether(self, as_read, b);
    } else {
      for (size_t k = 0; k < heads.size(); ++k) {
        parallel::TrainSync(self, copied, a[k]);
        parallel::TrainSync(self, as_read, b[k]);
      }
    }
    for (size_t k = 0; k < heads.size(); ++k) {
      EXPECT_EQ(heads[k].params, raw[k].params) << "head " << k << (together ? " together" : " alone");
      EXPECT_GT(raw[k].curve.back().accuracy, 0.9) << "head " << k;
    }
  };
  both(MixedHeads(x, y, 24, 3), true);
  both(MixedHeads(x, y, 24, 3), false);
  HeadConfig lbfgs;
  lbfgs.optimizer = "lbfgs";
  lbfgs.epochs = 30;
  lbfgs.l2 = 1e-3;
  both({InitHead(lbfgs, x.data(), y.data(), n, 24, 3)}, false);
}

TEST(HeadBatch, OnlyHeadsOnTheSameBatchesTrainTogether) {
  std::vector<float> x;
  std::vector<uint8_t> y;
  Blobs(60, 6, 3, 5, &x, &y);
  std::vector<Head> h = MixedHeads(x, y, 6, 2);
  EXPECT_TRUE(parallel::CanTrainTogether(h[0], h[2]));
  Head other_batch = h[1];
  other_batch.config.batch = 20;
  Head other_order = h[1];
  other_order.config.data_seed = 10;
  Head lbfgs = h[1];
  lbfgs.config.optimizer = "lbfgs";
  Head other_stats = h[1];
  other_stats.mean[0] += 1;
  for (const Head* bad : {&other_batch, &other_order, &lbfgs, &other_stats}) EXPECT_FALSE(parallel::CanTrainTogether(h[0], *bad));
  std::vector<float> xs(x.size());
  h[0].Standardize(x.data(), 60, xs.data());
  parallel::SelfComm self;
  EXPECT_EQ(ErrorOf([&] { parallel::TrainSyncTogether(self, {xs.data(), y.data(), 60}, {&h[0], &other_batch}); }),
            "TrainSyncTogether: heads that cannot be trained together");
}

TEST(Metrics, CountsAndMerges) {
  std::vector<float> z = {2, 1, 3, 0, 1, 5};  // 3 rows x 2 classes: predicts 0, 0, 1
  std::vector<uint8_t> y = {0, 1, 1};
  Metrics m = Evaluate(z.data(), y.data(), 3, 2);
  EXPECT_EQ(m.correct, 2);
  EXPECT_EQ(m.confusion, (std::vector<int64_t>{1, 0, 1, 1}));
  EXPECT_NEAR(m.loss(), (std::log(1 + std::exp(-1.0)) + std::log(1 + std::exp(3.0)) + std::log(1 + std::exp(-4.0))) / 3, 1e-6);
  Metrics total;
  total.Merge(m);
  total.Merge(m);
  EXPECT_EQ(total.count, 6);
  EXPECT_EQ(total.confusion[2], 2);
}

}  // namespace
}  // namespace msaflow::kernels
