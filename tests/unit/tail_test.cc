// The trainable tail (kernels/tail.h): its gradients against central finite differences on small
// graphs of every operator it trains through, its forward pass against the inference executor,
// and its refusals. (tests/python/tail_grad_test.py checks the same gradients against PyTorch's
// autograd, and the tails of the shipped models.)
#include "kernels/tail.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "common/error.h"
#include "common/files.h"
#include "kernels/executor.h"
#include "kernels/head.h"

namespace msaflow::kernels {
namespace {

struct Builder {
  Graph g;
  std::mt19937 rng{7};

  Builder(const std::string& input, TensorDims dims) {
    g.input = input;
    g.input_dims = std::move(dims);
  }
  void Const(const std::string& name, TensorDims dims, float scale = 0.3f, float offset = 0.f) {
    std::uniform_real_distribution<float> u(-scale, scale);
    ConstTensor t;
    t.dims = dims;
    t.data.resize(static_cast<size_t>(NumElements(dims)));
    for (auto& v : t.data) v = u(rng) + offset;
    g.consts[name] = t;
  }
  Node& Add(const std::string& op, std::vector<std::string> inputs, const std::string& out) {
    Node n;
    n.name = out;
    n.op = op;
    n.inputs = std::move(inputs);
    n.outputs = {out};
    g.nodes.push_back(n);
    g.output = out;
    return g.nodes.back();
  }
  static void Ints(Node& n, const std::string& name, std::vector<int64_t> v) { n.attrs[name].ints = std::move(v); }
  static void Int(Node& n, const std::string& name, int64_t v) { n.attrs[name].i = v; }
  static void Float(Node& n, const std::string& name, float v) { n.attrs[name].f = v; }
  // A convolution with its weights and bias.
  Node& Conv(const std::string& in, const std::string& out, int64_t cin, int64_t cout, int64_t k, int64_t group = 1) {
    Const(out + ".W", {cout, cin / group, k, k});
    Const(out + ".B", {cout}, 0.1f);
    Node& n = Add("Conv", {in, out + ".W", out + ".B"}, out);
    Int(n, "group", group);
    Ints(n, "pads", {k / 2, k / 2, k / 2, k / 2});
    return n;
  }
};

std::vector<float> Random(size_t n, float lo, float hi, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

double Loss(Tail& tail, const std::vector<float>& x, const TensorDims& dims, const std::vector<float>& w) {
  const auto& f = tail.Forward({x.data()}, {dims});
  double s = 0;
  for (size_t i = 0; i < f.size(); ++i) s += static_cast<double>(f[i]) * w[i];
  return s;
}

// Every param's gradient (a sample of entries) and the input's against central differences
// with step eps (small enough that no max-pooling window changes its winner).
void CheckGradients(const Graph& g, const std::string& from, const TensorDims& dims, float eps = 1e-3f) {
  Tail tail(g, from);
  ASSERT_EQ(tail.inputs().size(), 1u);
  std::vector<float> x = Random(static_cast<size_t>(NumElements(dims)), -1.f, 1.f, 3);
  const auto& f = tail.Forward({x.data()}, {dims});
  const std::vector<float> w = Random(f.size(), -1.f, 1.f, 5);
  std::vector<std::vector<float>> dx;
  tail.Backward(w.data(), &dx);
  auto check = [&](const std::string& what, std::vector<float>& values, const std::vector<float>& grad) {
    float scale = 0;
    for (float v : grad) scale = std::max(scale, std::fabs(v));
    ASSERT_GT(scale, 0.f) << what << ": an all-zero gradient";
    std::mt19937 rng(11);
    for (int s = 0; s < 24; ++s) {
      const size_t i = std::uniform_int_distribution<size_t>(0, values.size() - 1)(rng);
      const float keep = values[i];
      values[i] = keep + eps;
      const double up = Loss(tail, x, dims, w);
      values[i] = keep - eps;
      const double down = Loss(tail, x, dims, w);
      values[i] = keep;
      const double fd = (up - down) / (2.0 * eps);
      EXPECT_NEAR(fd, grad[i], 1e-2 * scale + 1e-3) << what << "[" << i << "]";
    }
  };
  for (auto& p : tail.params()) {
    const std::vector<float> grad = p.grad;
    check(p.name, p.value, grad);
  }
  check("input", x, dx[0]);
}

TEST(Tail, MobileNetBlockGradients) {
  // expand 1x1, ReLU6, depthwise 3x3 stride 1, ReLU6, project 1x1, residual add.
  Builder b("x", {2, 4, 5, 5});
  b.Conv("x", "expand", 4, 8, 1);
  Node& c1 = b.Add("Clip", {"expand"}, "expand_relu");
  Builder::Float(c1, "min", 0.f);
  Builder::Float(c1, "max", 6.f);
  b.Conv("expand_relu", "dw", 8, 8, 3, 8);
  Node& c2 = b.Add("Clip", {"dw"}, "dw_relu");
  Builder::Float(c2, "min", 0.f);
  Builder::Float(c2, "max", 6.f);
  b.Conv("dw_relu", "project", 8, 4, 1);
  b.Add("Add", {"project", "x"}, "add");
  CheckGradients(b.g, "expand", {2, 4, 5, 5});
}

TEST(Tail, SqueezeExciteHardSwishBatchNormGradients) {
  Builder b("x", {2, 3, 6, 6});
  b.Conv("x", "conv", 3, 4, 3);
  b.Const("bn.s", {4}, 0.5f, 1.f);
  b.Const("bn.b", {4}, 0.2f);
  b.Const("bn.m", {4}, 0.2f);
  b.Const("bn.v", {4}, 0.3f, 1.f);
  b.Add("BatchNormalization", {"conv", "bn.s", "bn.b", "bn.m", "bn.v"}, "bn");
  b.Add("HardSwish", {"bn"}, "hs");
  b.Add("GlobalAveragePool", {"hs"}, "se_pool");
  b.Conv("se_pool", "se_reduce", 4, 2, 1);
  b.Add("Relu", {"se_reduce"}, "se_relu");
  b.Conv("se_relu", "se_expand", 2, 4, 1);
  Node& hsig = b.Add("HardSigmoid", {"se_expand"}, "se_gate");
  Builder::Float(hsig, "alpha", 1.f / 6);
  Builder::Float(hsig, "beta", 0.5f);
  b.Add("Mul", {"hs", "se_gate"}, "scaled");
  b.Add("Sigmoid", {"scaled"}, "out");
  CheckGradients(b.g, "conv", {2, 3, 6, 6});
}

// stem: a strided convolution; then `op` on it, or on a dilated convolution of it.
Builder PoolGraph(const std::string& op) {
  Builder b("x", {2, 3, 7, 7});
  Node& c = b.Conv("x", "stem", 3, 4, 3);
  Builder::Ints(c, "strides", {2, 2});
  if (op == "AveragePool") {
    Node& dil = b.Conv("stem", "dilated", 4, 4, 3);
    Builder::Ints(dil, "dilations", {2, 2});
    Builder::Ints(dil, "pads", {2, 2, 2, 2});
  }
  Node& p = b.Add(op, {op == "MaxPool" ? "stem" : "dilated"}, "pool");
  Builder::Ints(p, "kernel_shape", {3, 3});
  Builder::Ints(p, "strides", {2, 2});
  if (op == "MaxPool") Builder::Ints(p, "pads", {1, 1, 1, 1});
  if (op == "AveragePool") Builder::Int(p, "ceil_mode", 1);
  b.Add("Relu", {"pool"}, "out");
  return b;
}

TEST(Tail, MaxPoolGradients) { CheckGradients(PoolGraph("MaxPool").g, "stem", {2, 3, 7, 7}, 1e-4f); }

TEST(Tail, DilatedConvAveragePoolCeilModeGradients) {
  CheckGradients(PoolGraph("AveragePool").g, "stem", {2, 3, 7, 7});
}

TEST(Tail, ConcatGradients) {
  Builder b("x", {2, 3, 5, 5});
  b.Conv("x", "a", 3, 4, 3);
  b.Conv("a", "b", 4, 2, 1);
  b.Add("Concat", {"b", "a"}, "cat");
  Builder::Int(b.g.nodes.back(), "axis", 1);
  b.Add("Sigmoid", {"cat"}, "out");
  CheckGradients(b.g, "a", {2, 3, 5, 5});
}

TEST(Tail, FlattenGemmMatMulGradients) {
  Builder b("x", {3, 2, 4, 4});
  b.Conv("x", "conv", 2, 3, 3);
  b.Add("Relu", {"conv"}, "relu");
  b.Add("Flatten", {"relu"}, "flat");
  b.Const("fc.W", {5, 48});
  b.Const("fc.C", {5}, 0.1f);
  Node& gemm = b.Add("Gemm", {"flat", "fc.W", "fc.C"}, "fc");
  Builder::Int(gemm, "transB", 1);
  Builder::Float(gemm, "beta", 0.5f);
  b.Const("mm.B", {5, 4});
  b.Add("MatMul", {"fc", "mm.B"}, "out");
  CheckGradients(b.g, "conv", {3, 2, 4, 4});
}

TEST(Tail, ForwardMatchesTheExecutor) {
  Builder b("x", {-1, 4, 9, 9});
  b.Conv("x", "expand", 4, 8, 1);
  Node& c1 = b.Add("Clip", {"expand"}, "expand_relu");
  Builder::Float(c1, "min", 0.f);
  Builder::Float(c1, "max", 6.f);
  Node& dw = b.Conv("expand_relu", "dw", 8, 8, 3, 8);
  Builder::Ints(dw, "strides", {2, 2});
  b.Add("Relu", {"dw"}, "out");
  const TensorDims dims{3, 4, 9, 9};
  std::vector<float> x = Random(static_cast<size_t>(NumElements(dims)), -2.f, 2.f, 9);
  Tail tail(b.g, "expand");
  const std::vector<float> mine = tail.Forward({x.data()}, {dims});
  Executor ex(b.g);
  const std::vector<float> ref = ex.Features(x.data(), 3, 4, 9, 9);
  ASSERT_EQ(mine.size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(mine[i], ref[i], 1e-5f * (1.f + std::fabs(ref[i]))) << i;
  EXPECT_EQ(tail.FeatureDim(), 8);
  EXPECT_EQ(tail.NodeNames(), (std::vector<std::string>{"expand", "expand_relu", "dw", "out"}));
  EXPECT_EQ(tail.ParamCount(), 8 * 4 + 8 + 8 * 9 + 8);
}

// Tail::Backward's FinalFrom: called with p falling to 0, and each time the grads of params p, p +
// 1, ... are what the whole pass ends with, so a caller may send them on (parallel::FinetuneSync's
// buckets). A weight read twice (a shared bias, read by the first and the last convolution) is
// final only after its first reader.
TEST(Tail, BackwardSaysWhichGradientsAreFinal) {
  Builder b("x", {2, 4, 5, 5});
  b.Const("expand.W", {4, 4, 1, 1});
  b.Const("shared.B", {4}, 0.1f);
  Builder::Int(b.Add("Conv", {"x", "expand.W", "shared.B"}, "expand"), "group", 1);
  b.Add("Relu", {"expand"}, "relu");
  b.Conv("relu", "dw", 4, 4, 3, 4);
  b.Const("project.W", {4, 4, 1, 1});
  Builder::Int(b.Add("Conv", {"dw", "project.W", "shared.B"}, "project"), "group", 1);
  b.Add("Add", {"project", "x"}, "out");
  Tail tail(b.g, "expand");
  ASSERT_EQ(tail.params().size(), 5u);  // expand.W, shared.B, dw.W, dw.B, project.W
  const TensorDims dims{2, 4, 5, 5};
  const std::vector<float> x = Random(static_cast<size_t>(NumElements(dims)), -1.f, 1.f, 3);
  const auto& f = tail.Forward({x.data()}, {dims});
  const std::vector<float> w = Random(f.size(), -1.f, 1.f, 5);
  std::vector<std::pair<size_t, std::vector<std::vector<float>>>> seen;  // p, and the grads from p on
  tail.Backward(w.data(), nullptr, [&](size_t p) {
    std::vector<std::vector<float>> g;
    for (size_t i = p; i < tail.params().size(); ++i) g.push_back(tail.params()[i].grad);
    seen.emplace_back(p, std::move(g));
  });
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.back().first, 0u);
  bool shared_seen_final_early = false;
  for (size_t k = 0; k < seen.size(); ++k) {
    if (k > 0) {
      EXPECT_LE(seen[k].first, seen[k - 1].first) << "call " << k;
    }
    for (size_t i = seen[k].first; i < tail.params().size(); ++i)
      EXPECT_EQ(seen[k].second[i - seen[k].first], tail.params()[i].grad) << tail.params()[i].name << " at call " << k;
    if (seen[k].first <= 1 && k + 1 < seen.size()) shared_seen_final_early = true;
  }
  EXPECT_FALSE(shared_seen_final_early) << "shared.B said final before its first reader's backward step";
}

TEST(Tail, TrainsFromTheMiddleWithTheFrozenPartAsInput) {
  // A residual that reads the frozen part: the tail's inputs are the tensors it reads from there.
  Builder b("x", {2, 3, 5, 5});
  b.Conv("x", "frozen", 3, 4, 3);
  b.Conv("frozen", "t1", 4, 4, 3);
  b.Add("Add", {"t1", "frozen"}, "out");
  const TailSplit split = SplitTail(b.g, "t1");
  EXPECT_EQ(split.inputs, std::vector<std::string>{"frozen"});
  EXPECT_EQ(split.nodes, (std::vector<size_t>{1, 2}));
  CheckGradients(b.g, "t1", {2, 4, 5, 5});
}

TEST(Tail, WriteWeightsGivesTheExecutorTheTrainedModel) {
  Builder b("x", {-1, 2, 5, 5});
  b.Conv("x", "conv", 2, 3, 3);
  b.Add("Relu", {"conv"}, "out");
  Tail tail(b.g, "conv");
  for (auto& p : tail.params())
    for (auto& v : p.value) v *= -1.5f;
  const TensorDims dims{2, 2, 5, 5};
  std::vector<float> x = Random(static_cast<size_t>(NumElements(dims)), -1.f, 1.f, 4);
  const std::vector<float> mine = tail.Forward({x.data()}, {dims});
  Graph g = b.g;
  tail.WriteWeights(&g);
  Executor ex(g);
  const std::vector<float> ref = ex.Features(x.data(), 2, 2, 5, 5);
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(mine[i], ref[i], 1e-5f * (1.f + std::fabs(ref[i])));
}

// The fine-tuning data path on a shipped model: the trunk's maps at the freeze point
// (Executor::Maps of the model cut at the tail's inputs) run through the tail give the whole
// model's features.
void CheckTrunkThenTail(const std::string& model, const std::string& cut, const std::string& from, int64_t size) {
  const std::string path = std::string(MSAFLOW_SOURCE_DIR) + "/models/" + model;
  const std::string bytes = ReadFile(path);
  Graph whole = ImportOnnx(bytes, path, cut);
  Tail tail(whole, from);
  Executor trunk(ImportOnnxCuts(bytes, path, tail.inputs()));
  const int64_t n = 2;
  std::vector<float> x = Random(static_cast<size_t>(n * 3 * size * size), 0.f, 1.f, 8);
  std::vector<TensorDims> dims;
  const std::vector<std::vector<float>> maps = trunk.Maps(x.data(), n, 3, size, size, &dims);
  ASSERT_EQ(maps.size(), tail.inputs().size());
  // Pooled, the maps are the trunk's features.
  const std::vector<float> pooled = trunk.Features(x.data(), n, 3, size, size);
  const int64_t c0 = dims[0][1], hw0 = dims[0][2] * dims[0][3];
  for (int64_t i = 0; i < n * c0; ++i) {
    double s = 0;
    for (int64_t j = 0; j < hw0; ++j) s += maps[0][static_cast<size_t>(i * hw0 + j)];
    EXPECT_NEAR(s / static_cast<double>(hw0), pooled[static_cast<size_t>(i)],
                1e-4 * (1 + std::fabs(pooled[static_cast<size_t>(i)])));
  }
  std::vector<const float*> ptrs;
  for (const auto& m : maps) ptrs.push_back(m.data());
  const std::vector<float> mine = tail.Forward(ptrs, dims);
  const std::vector<float> ref = Executor(whole).Features(x.data(), n, 3, size, size);
  ASSERT_EQ(mine.size(), ref.size());
  float scale = 0;
  for (float v : ref) scale = std::max(scale, std::fabs(v));
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(mine[i], ref[i], 1e-4f * scale) << model << " feature " << i;
}

TEST(Tail, MobileNetV2TrunkMapsThroughTheTailGiveTheModelsFeatures) {
  CheckTrunkThenTail("mobilenet_v2.onnx", "block_13_expand_relu", "block_11_expand", 96);
}

TEST(Tail, InceptionV3TrunkMapsThroughTheTailGiveTheModelsFeatures) {
  CheckTrunkThenTail("inception_v3.onnx", "mixed2", "mixed1", 75);
}

// The head's gradient with respect to its (standardised) input, which the tail trains on,
// against central differences of its loss, for a softmax and an MLP head.
TEST(Tail, HeadInputGradientMatchesFiniteDifferences) {
  const int64_t n = 6, dim = 5, classes = 3;
  std::vector<float> x = Random(static_cast<size_t>(n * dim), -1.f, 1.f, 21);
  std::vector<uint8_t> y{0, 1, 2, 0, 1, 2};
  for (const std::string type : {"softmax", "mlp"}) {
    HeadConfig cfg;
    cfg.type = type;
    cfg.hidden = 7;
    Head h = InitHead(cfg, x.data(), y.data(), n, dim, classes);
    GradientKernel kernel(h, n);
    std::vector<float> grad(h.params.size()), dx(x.size());
    int64_t correct = 0;
    kernel.Accumulate(h, x.data(), y.data(), n, 1.f, grad.data(), &correct, dx.data());
    for (size_t i = 0; i < x.size(); ++i) {
      const float keep = x[i];
      auto loss = [&](float v) {
        x[i] = v;
        std::vector<float> g(h.params.size());
        int64_t c = 0;
        return kernel.Accumulate(h, x.data(), y.data(), n, 1.f, g.data(), &c);
      };
      const double fd = (loss(keep + 1e-3f) - loss(keep - 1e-3f)) / 2e-3;
      x[i] = keep;
      EXPECT_NEAR(fd, dx[i], 2e-3 * (1 + std::fabs(fd))) << type << " x[" << i << "]";
    }
  }
}

std::string ErrorOf(const std::function<void()>& f, ErrorKind* kind) {
  try {
    f();
  } catch (const Error& e) {
    *kind = e.kind();
    return e.what();
  }
  return "";
}

TEST(Tail, RefusalsNameTheLayerAndWhatWouldWork) {
  Builder b("x", {2, 2, 5, 5});
  b.Conv("x", "conv1", 2, 2, 3);
  b.Add("Softsign", {"conv1"}, "odd");
  b.Conv("odd", "conv2", 2, 2, 3);
  b.Add("Relu", {"conv2"}, "out");
  ErrorKind kind{};
  EXPECT_EQ(ErrorOf([&] { SplitTail(b.g, "conv1"); }, &kind),
            "train_from 'conv1': layer 'odd' (Softsign) has no backward pass in msaflow; the nearest later layer to "
            "train from is 'conv2' (docs/finetune.md lists the operators that train)");
  EXPECT_EQ(kind, ErrorKind::kUnsupported);
  EXPECT_EQ(ErrorOf([&] { SplitTail(b.g, "conv_2"); }, &kind),
            "train_from 'conv_2': no layer of the cut model (up to 'out') has that name — did you mean \"conv2\"?");
  EXPECT_EQ(kind, ErrorKind::kNotFound);
  EXPECT_EQ(ErrorOf([&] { SplitTail(b.g, "out"); }, &kind),
            "train_from 'out': the layers from it to the cut 'out' hold no weights to train");
  EXPECT_EQ(kind, ErrorKind::kInvalidInput);
  EXPECT_NO_THROW(Tail(b.g, "conv2"));
}

}  // namespace
}  // namespace msaflow::kernels
