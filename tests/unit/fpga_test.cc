// The FPGA backends against each other: OpenCL (PoCL's CPU device here, which CI installs) and
// the C++ arithmetic must prepare the same values and order candidates the same way, on random
// and adversarial inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "common/error.h"
#include "kernels/fpga/cost_model.h"
#include "kernels/fpga/device.h"
#include "kernels/fpga/select.h"
#include "workflow/fpga_config.h"

namespace msaflow::kernels::fpga {
namespace {

std::unique_ptr<Device> OpenCl() {
  Config c;
  c.backend = Backend::kOpenCl;
  return OpenOpenCl(c);  // throws (and fails the test) when no OpenCL platform is installed
}

Device& Shared() {
  static std::unique_ptr<Device> d = OpenCl();  // one kernel build for the whole file
  return *d;
}

std::vector<uint8_t> RandomPixels(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> px(n);
  for (auto& p : px) p = static_cast<uint8_t>(rng() & 0xff);
  // A few runs of extremes, where interpolation and saturation are tested hardest.
  for (size_t i = 0; i + 8 < n; i += 97) std::fill(px.begin() + static_cast<std::ptrdiff_t>(i), px.begin() + static_cast<std::ptrdiff_t>(i + 4), (i / 97) % 2 ? 255 : 0);
  return px;
}

struct Shape {
  int64_t rows, cols, cin, height, width, cout;
};

class PrepareBackends : public ::testing::TestWithParam<Shape> {};

TEST_P(PrepareBackends, OpenClEqualsCpuFloatAndInt8) {
  const Shape s = GetParam();
  const int64_t count = 5;
  auto px = RandomPixels(static_cast<size_t>(count * s.rows * s.cols * s.cin), static_cast<uint32_t>(s.rows * 131 + s.cin));
  ImageBatch in{px.data(), count, s.rows, s.cols, s.cin};
  InputSpec spec;
  spec.height = s.height;
  spec.width = s.width;
  spec.channels = s.cout;
  spec.mean = {0.485f, 0.456f, 0.406f};
  spec.std = {0.229f, 0.224f, 0.225f};
  const size_t n = static_cast<size_t>(count * s.cout * s.height * s.width);
  std::vector<float> cpu(n, -7.f), cl(n, 7.f);
  OpenCpu()->Prepare(in, spec, cpu.data());
  Shared().Prepare(in, spec, cl.data());
  size_t differ = 0;
  float worst = 0;
  for (size_t i = 0; i < n; ++i) {
    worst = std::max(worst, std::fabs(cpu[i] - cl[i]));
    differ += cpu[i] != cl[i];
  }
  EXPECT_LE(worst, 1e-6f);
  // Same operations, same order, no contraction: the bits agree too (the end-to-end test
  // relies on it for equal metrics).
  EXPECT_EQ(differ, 0u) << "of " << n << " values";
  std::vector<int8_t> qcpu(n, 1), qcl(n, 2);
  OpenCpu()->PrepareInt8(in, spec, qcpu.data());
  Shared().PrepareInt8(in, spec, qcl.data());
  EXPECT_EQ(qcpu, qcl);
  // The int8 path is the float path quantised: within half a step.
  const PrepareConstants k = MakeConstants(spec);
  const int64_t plane = s.height * s.width;
  for (size_t i = 0; i < n; i += 7) {
    const size_t c = static_cast<size_t>((static_cast<int64_t>(i) / plane) % s.cout);
    EXPECT_LE(std::fabs(qcpu[i] * k.q_scale[c] - cpu[i]), 0.5f * k.q_scale[c] + 1e-6f) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(OddSizes, PrepareBackends,
                         ::testing::Values(Shape{17, 23, 1, 31, 29, 3},   // gray replicated, upscaled
                                           Shape{45, 37, 3, 13, 11, 3},   // colour kept, downscaled
                                           Shape{19, 21, 3, 9, 33, 1},    // colour to a gray model (luma)
                                           Shape{28, 28, 1, 64, 64, 1},   // gray kept
                                           Shape{1, 1, 3, 8, 8, 2},       // one pixel, two channels
                                           Shape{7, 3, 1, 7, 3, 3}));     // same size

TEST(Prepare, KnownValues) {
  // One RGB pixel to 2 x 2: every output is that pixel, normalised per channel.
  std::vector<uint8_t> px = {255, 0, 51};
  InputSpec spec;
  spec.height = spec.width = 2;
  spec.channels = 3;
  spec.mean = {0.5f, 0.f, 0.f};
  spec.std = {0.5f, 1.f, 0.5f};
  std::vector<float> out(12);
  PrepareBatch({px.data(), 1, 1, 1, 3}, spec, out.data());
  for (int i = 0; i < 4; ++i) {
    EXPECT_FLOAT_EQ(out[static_cast<size_t>(i)], 1.f);
    EXPECT_FLOAT_EQ(out[static_cast<size_t>(4 + i)], 0.f);
    EXPECT_NEAR(out[static_cast<size_t>(8 + i)], 0.4f, 1e-6);
  }
  // The same pixel for a gray model: luma 0.299 * 255 + 0.114 * 51.
  spec.channels = 1;
  spec.mean = {0, 0, 0};
  spec.std = {1, 1, 1};
  PrepareBatch({px.data(), 1, 1, 1, 3}, spec, out.data());
  EXPECT_NEAR(out[0], (0.299 * 255 + 0.114 * 51) / 255, 1e-6);
  std::vector<int8_t> q(4);
  PrepareBatchInt8({px.data(), 1, 1, 1, 3}, spec, q.data());
  EXPECT_EQ(q[0], static_cast<int8_t>(std::nearbyint(out[0] * 127)));
}

TEST(Prepare, BadShapesAreRefused) {
  std::vector<uint8_t> px(16);
  InputSpec spec;
  spec.height = spec.width = 4;
  std::vector<float> out(48);
  try {
    Shared().Prepare({px.data(), 1, 2, 2, 2}, spec, out.data());
    FAIL() << "two-channel images were accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
    EXPECT_STREQ(e.what(), "prepare: images have 2 channels; expected 1 (gray) or 3 (RGB)");
  }
  EXPECT_THROW(OpenCpu()->Prepare({px.data(), 1, 0, 2, 1}, spec, out.data()), Error);
}

// The reference order: metric descending, then candidate id.
std::vector<std::string> Reference(std::vector<Scored> s) {
  std::sort(s.begin(), s.end(), [](const Scored& a, const Scored& b) {
    return a.metric != b.metric ? a.metric > b.metric : a.candidate < b.candidate;
  });
  std::vector<std::string> ids;
  for (const auto& x : s) ids.push_back(x.candidate);
  return ids;
}

std::vector<std::string> Ids(const std::vector<Scored>& s) {
  std::vector<std::string> ids;
  for (const auto& x : s) ids.push_back(x.candidate);
  return ids;
}

void ExpectSameOrder(const std::vector<Scored>& scores) {
  auto cpu = OpenCpu();
  auto a = SelectOrder(*cpu, scores), b = SelectOrder(Shared(), scores);
  EXPECT_EQ(Ids(a), Ids(b));
  EXPECT_EQ(Ids(a), Reference(scores));
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) EXPECT_EQ(std::memcmp(&a[i].metric, &b[i].metric, 8), 0);
}

TEST(Select, BackendsAgreeOnAdversarialInputs) {
  ExpectSameOrder({{"r1-c00", 0.5}});  // one candidate
  ExpectSameOrder({{"r1-c02", 0.9}, {"r1-c01", 0.9}, {"r1-c00", 0.5}, {"r2-c00", 0.95}});  // a tie
  std::vector<Scored> equal;
  for (int i = 40; i >= 0; --i) equal.push_back({"c" + std::to_string(1000 + i * 7 % 41), 0.75});
  ExpectSameOrder(equal);  // all equal: id order
  ExpectSameOrder({{"b", -0.0}, {"a", 0.0}, {"c", -1e-300}, {"d", 1e-300}, {"e", -INFINITY}, {"f", INFINITY},
                   {"g", -2.0}, {"h", std::nextafter(0.5, 1.0)}, {"i", 0.5}});  // signs, zeros, infinities, ulps
}

TEST(Select, BackendsAgreeOnThousandsOfRandomCandidates) {
  std::mt19937_64 rng(7);
  for (size_t n : {2u, 63u, 64u, 65u, 1000u, 4097u}) {
    std::vector<Scored> s;
    for (size_t i = 0; i < n; ++i) {
      // Accuracies as evaluation gives them (k / 300), so ties are common.
      double m = static_cast<double>(rng() % 301) / 300.0;
      char id[16];
      std::snprintf(id, sizeof id, "r%zu-c%05zu", i % 3, static_cast<size_t>(rng() % 100000));
      s.push_back({id + std::to_string(i), m});
    }
    ExpectSameOrder(s);
  }
}

TEST(Select, RefusesNaNNothingAndDuplicates) {
  auto cpu = OpenCpu();
  for (Device* d : {&Shared(), cpu.get()}) {
    try {
      SelectOrder(*d, {{"r1-c00", 0.5}, {"r1-c01", std::nan("")}});
      ADD_FAILURE() << "NaN accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
      EXPECT_STREQ(e.what(), "select: candidate 'r1-c01' has no valid metric (NaN); its evaluation failed or diverged");
    }
    try {
      SelectOrder(*d, {});
      ADD_FAILURE() << "no results accepted";
    } catch (const Error& e) {
      EXPECT_STREQ(e.what(), "select: no results to select from");
    }
    EXPECT_THROW(SelectOrder(*d, {{"a", 0.1}, {"a", 0.2}}), Error);
  }
}

TEST(Select, OrderKeyIsMonotone) {
  std::vector<double> v = {-INFINITY, -1e300, -1.5, -1e-310, 0.0, 1e-310, 0.25, 1.0, 1e300, INFINITY};
  for (size_t i = 1; i < v.size(); ++i) EXPECT_LT(OrderKey(v[i - 1]), OrderKey(v[i])) << v[i];
  EXPECT_EQ(OrderKey(-0.0), OrderKey(0.0));
}

TEST(Device, NamesPoClAndShowsTheBuildLog) {
  EXPECT_EQ(Shared().Backend(), "opencl");
  EXPECT_NE(Shared().Name().find("Portable Computing Language"), std::string::npos) << Shared().Name();
  auto dir = std::filesystem::temp_directory_path() / ("msaflow-fpga-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  {
    std::ofstream(dir / "broken.cl") << "__kernel void prepare(__global float* x) { x[0] = undeclared_name; }\n";
  }
  Config c;
  c.backend = Backend::kOpenCl;
  c.source = (dir / "broken.cl").string();
  try {
    OpenOpenCl(c);
    ADD_FAILURE() << "a kernel that does not compile was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
    std::string what = e.what();
    EXPECT_NE(what.find("do not build"), std::string::npos) << what;
    EXPECT_NE(what.find("build log:"), std::string::npos) << what;
    EXPECT_NE(what.find("undeclared_name"), std::string::npos) << what;  // the compiler's own words
  }
  {
    std::ofstream(dir / "junk.aocx") << "not a program binary";
  }
  c.source.clear();
  c.binary = (dir / "junk.aocx").string();
  try {
    OpenOpenCl(c);
    ADD_FAILURE() << "a junk binary was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("junk.aocx"), std::string::npos) << e.what();
  }
  c.binary.clear();
  c.platform = "no such vendor";
  try {
    OpenOpenCl(c);
    ADD_FAILURE() << "a platform that is not there was found";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("no OpenCL platform named like 'no such vendor'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("Portable Computing Language"), std::string::npos) << e.what();
  }
  std::string notice;
  c.backend = Backend::kAuto;
  auto d = Open(c, &notice);  // auto with a platform that does not match: the CPU, and why
  EXPECT_EQ(d->Backend(), "cpu");
  EXPECT_NE(notice.find("fpga auto: no OpenCL device, so the CPU backend"), std::string::npos) << notice;
  std::filesystem::remove_all(dir);
}

TEST(Config, ParsedFromMachineFiles) {
  using nlohmann::json;
  auto c = workflow::FpgaConfigFromJson(json("simulated"), "m.json: /modules/dam/fpga", "/etc");
  EXPECT_EQ(c.backend, Backend::kAuto);
  c = workflow::FpgaConfigFromJson(
      json::parse(R"({"backend": "opencl", "platform": "Intel", "binary": "k.aocx",
                      "target": {"name": "S10", "clock_mhz": 400, "lanes": 16, "memory_gbs": 76.8}})"),
      "m.json: /modules/dam/fpga", "/etc/msaflow");
  EXPECT_EQ(c.binary, "/etc/msaflow/k.aocx");
  EXPECT_TRUE(c.target.given());
  EXPECT_EQ(workflow::FpgaConfigToJson(c)["target"]["lanes"], 16);
  auto err = [](const char* text) {
    try {
      workflow::FpgaConfigFromJson(json::parse(text), "m.json: /modules/dam/fpga", "/");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(err(R"("fpga")"), "m.json: /modules/dam/fpga: \"fpga\" is not one of cpu, opencl, auto");
  EXPECT_EQ(err(R"({"backend": "opencl", "target": {"clock_mhz": 400, "lanes": 0, "memory_gbs": 1}})"),
            "m.json: /modules/dam/fpga/target/lanes: expected a number in (0, 1000000]");
  EXPECT_EQ(err(R"({"backend": "cpu", "board": 1})"),
            "m.json: /modules/dam/fpga/board: unknown field (expected backend, platform, binary, source, target)");
  EXPECT_EQ(err(R"({"platform": "x"})"), "m.json: /modules/dam/fpga: missing \"backend\" (cpu, opencl or auto)");
}

TEST(CostModel, RooflineOfPrepareAndSelect) {
  Target t{"board", 400, 16, 76.8};
  // 1000 images 28x28 gray -> 3 x 96 x 96 floats: 9.216M output pixels at 6.4 G/s = 1.44 ms;
  // 0.784 MB in + 110.6 MB out over 76.8 GB/s = 1.45 ms: memory bound, just.
  auto m = ModelPrepare(t, 1000, 28, 28, 1, 96, 96, 3, 4);
  EXPECT_NEAR(m.compute_s, 9216000 / 6.4e9, 1e-12);
  EXPECT_NEAR(m.memory_s, (784000 + 9216000 * 12.0) / 76.8e9, 1e-12);
  EXPECT_STREQ(m.bound(), "memory");
  auto q = ModelPrepare(t, 1000, 28, 28, 1, 96, 96, 3, 1);  // int8 output: a quarter of the bytes
  EXPECT_STREQ(q.bound(), "compute");
  EXPECT_NEAR(ModelSelect(t, 1000).compute_s, 1e6 / 6.4e9, 1e-15);
  EXPECT_EQ(ModelSelect(Target{}, 1000).seconds(), 0);  // no target: nothing modelled
}

}  // namespace
}  // namespace msaflow::kernels::fpga
