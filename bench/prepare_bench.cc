// bench/prepare: the FPGA's step-2 job (kernels/fpga/prepare.cl) on OpenCL against the C++ path,
// in the same run, on the same images, batch by batch as the prepare step feeds the backbone
// (64 images per call). Here OpenCL is PoCL's CPU device: the simulated FPGA, sharing this
// machine's cores with nothing else. Beside the measured figures, the throughput the cost model
// gives for the target board of configs/machines/deep-est.json (modelled, not measured).
//
//   bench_prepare [--images 4096] [--reps 5] [--check]
//
// --check also compares the outputs (bit-identical float, exact int8) and exits 1 if they differ.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "kernels/fpga/cost_model.h"
#include "kernels/fpga/device.h"
#include "workflow/machine.h"

namespace {

using namespace msaflow;
using namespace msaflow::kernels;
using Steady = std::chrono::steady_clock;

constexpr int64_t kBatch = 64;

struct Case {
  const char* what;
  int64_t rows, cols, cin;
  InputSpec spec;
};

InputSpec Spec(int64_t h, int64_t w, int64_t c) {
  InputSpec s;
  s.height = h;
  s.width = w;
  s.channels = c;
  s.mean = {0.5f, 0.5f, 0.5f};
  s.std = {0.5f, 0.5f, 0.5f};
  return s;
}

// Images per second preparing every image once, a batch per call.
double Rate(fpga::Device& d, const Case& c, const std::vector<uint8_t>& px, int64_t images, bool int8,
            std::vector<float>& out, std::vector<int8_t>& qout) {
  const int64_t per = c.rows * c.cols * c.cin;
  auto t0 = Steady::now();
  for (int64_t s = 0; s < images; s += kBatch) {
    ImageBatch b{px.data() + s * per, std::min(kBatch, images - s), c.rows, c.cols, c.cin};
    if (int8) {
      d.PrepareInt8(b, c.spec, qout.data());
    } else {
      d.Prepare(b, c.spec, out.data());
    }
  }
  return static_cast<double>(images) / std::chrono::duration<double>(Steady::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"prepare throughput: OpenCL (PoCL) vs C++"};
  int64_t images = 4096;
  int reps = 5;
  bool check = false;
  app.add_option("--images", images, "images per pass")->check(CLI::Range(64, 1 << 20));
  app.add_option("--reps", reps, "passes per backend (median)")->check(CLI::Range(1, 100));
  app.add_flag("--check", check, "compare the outputs too");
  CLI11_PARSE(app, argc, argv);
  try {
    auto cpu = fpga::OpenCpu();
    fpga::Config oc;
    oc.backend = fpga::Backend::kOpenCl;
    auto cl = fpga::OpenOpenCl(oc);
    // The board's figures as the DEEP-EST machine file gives them.
    const fpga::Target board =
        workflow::LoadMachine(std::string(MSAFLOW_SOURCE_DIR) + "/configs/machines/deep-est.json").modules.at("dam").fpga.target;
    if (!board.given()) Throw(ErrorKind::kInvalidInput, "configs/machines/deep-est.json: the dam's fpga has no target figures");
    std::printf("%s\n", bench::CpuLine().c_str());
    std::printf("C++ path vs %s, %lld images, batches of %lld, median of %d (interleaved)\n", cl->Name().c_str(),
                static_cast<long long>(images), static_cast<long long>(kBatch), reps);
    std::printf("%-44s %12s %12s %8s %10s %16s\n", "case", "C++ img/s", "OpenCL img/s", "ratio", "int8 ratio",
                "board img/s (m)");
    const Case cases[] = {{"gray 28x28 -> 3x96x96 (MobileNetV2, quickstart)", 28, 28, 1, Spec(96, 96, 3)},
                          {"gray 28x28 -> 3x48x48 (PP-OCRv4, quickstart)", 28, 28, 1, Spec(48, 48, 3)},
                          {"RGB 32x32 -> 3x96x96 (colour, CIFAR-sized)", 32, 32, 3, Spec(96, 96, 3)},
                          {"RGB 375x500 -> 3x224x224 (colour, photo-sized)", 375, 500, 3, Spec(224, 224, 3)}};
    int bad = 0;
    for (const Case& c : cases) {
      int64_t n = c.rows * c.cols > 100000 ? std::min<int64_t>(images, 256) : images;  // photos: fewer
      std::mt19937 rng(11);
      std::vector<uint8_t> px(static_cast<size_t>(n * c.rows * c.cols * c.cin));
      for (auto& p : px) p = static_cast<uint8_t>(rng() & 0xff);
      const size_t out_n = static_cast<size_t>(kBatch * c.spec.channels * c.spec.height * c.spec.width);
      std::vector<float> out(out_n);
      std::vector<int8_t> qout(out_n);
      Rate(*cl, c, px, std::min<int64_t>(n, 2 * kBatch), false, out, qout);  // build and warm the kernels
      Rate(*cl, c, px, std::min<int64_t>(n, 2 * kBatch), true, out, qout);
      std::vector<double> rc, ro, rq, rqc;
      for (int r = 0; r < reps; ++r) {
        rc.push_back(Rate(*cpu, c, px, n, false, out, qout));
        ro.push_back(Rate(*cl, c, px, n, false, out, qout));
        rqc.push_back(Rate(*cpu, c, px, n, true, out, qout));
        rq.push_back(Rate(*cl, c, px, n, true, out, qout));
      }
      auto m = fpga::ModelPrepare(board, n, c.rows, c.cols, c.cin, c.spec.height, c.spec.width, c.spec.channels, 4);
      std::printf("%-44s %12.0f %12.0f %7.2fx %9.2fx %16.0f\n", c.what, bench::Median(rc), bench::Median(ro),
                  bench::Median(ro) / bench::Median(rc), bench::Median(rq) / bench::Median(rqc),
                  static_cast<double>(n) / m.seconds());
      if (check) {
        ImageBatch b{px.data(), std::min(kBatch, n), c.rows, c.cols, c.cin};
        std::vector<float> a(out_n), o(out_n);
        std::vector<int8_t> qa(out_n), qo(out_n);
        cpu->Prepare(b, c.spec, a.data());
        cl->Prepare(b, c.spec, o.data());
        cpu->PrepareInt8(b, c.spec, qa.data());
        cl->PrepareInt8(b, c.spec, qo.data());
        if (std::memcmp(a.data(), o.data(), a.size() * sizeof(float)) != 0 || qa != qo) {
          std::printf("  ! outputs differ between the backends\n");
          ++bad;
        }
      }
    }
    std::printf("ratio: OpenCL over C++ (same images, same batches); board: the cost model's throughput for the\n"
                "target FPGA of configs/machines/deep-est.json (modelled, float output), not a measurement\n");
    return bad ? 1 : 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_prepare: %s\n", e.what());
    return 1;
  }
}
