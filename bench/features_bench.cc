// bench/features: the backbone's features through msaflow's oneDNN executor, the msaflow side of
// bench/versus.py (which runs PyTorch on the same input and compares the features).
//
//   bench_features --model M.onnx --cut LAYER --input X.f32 --n N --channels C --size S
//                  [--batch 64] [--reps 3] [--precision f32|bf16|int8] [--calibrate 256] [--output F.f32]
//
// X.f32 holds N prepared images (N x C x S x S float32). Prints one JSON object: images per
// second (median over --reps passes over all N, in batches of --batch after one warm-up batch)
// and the feature width (int8: ranges calibrated first on the first --calibrate images, not
// timed); --output writes the features of the last pass. Beside it, this
// machine's sgemm rate through the same oneDNN (2048^3, all threads): the bound a convolution
// network's images/s cannot pass, given its FLOPs per image.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "common/error.h"
#include "common/files.h"
#include "kernels/executor.h"
#include "kernels/gemm.h"
#include "kernels/onnx_graph.h"

int main(int argc, char** argv) {
  using namespace msaflow;
  CLI::App app{"backbone features through the oneDNN executor (bench/versus.py runs it)"};
  std::string model, cut, input, output, precision = "f32";
  int64_t n = 0, channels = 3, size = 96, batch = 64, calibrate = 256;
  int reps = 3;
  app.add_option("--model", model)->required();
  app.add_option("--cut", cut)->required();
  app.add_option("--input", input)->required();
  app.add_option("--n", n)->required();
  app.add_option("--channels", channels);
  app.add_option("--size", size);
  app.add_option("--batch", batch);
  app.add_option("--reps", reps);
  app.add_option("--output", output);
  app.add_option("--precision", precision, "f32, bf16 or int8 (the executor's activations and weights)");
  app.add_option("--calibrate", calibrate, "int8: images its ranges are calibrated on (the first ones)");
  CLI11_PARSE(app, argc, argv);
  return bench::ReportErrors("bench_features", [&] {
    const std::string bytes = ReadFile(input);
    const int64_t per = channels * size * size;
    if (static_cast<int64_t>(bytes.size()) != n * per * 4)
      Throw(ErrorKind::kInvalidInput, input + ": " + std::to_string(bytes.size()) + " bytes, expected " +
                                          std::to_string(n * per * 4));
    std::vector<float> x(static_cast<size_t>(n * per));
    std::memcpy(x.data(), bytes.data(), bytes.size());
    kernels::Executor ex(kernels::ImportOnnx(ReadFile(model), model, cut), kernels::ParsePrecision(precision));
    std::vector<float> out;
    int64_t dim = 0;
    if (ex.ranges().empty() && precision == "int8")
      for (int64_t s = 0; s < std::min(calibrate, n); s += batch)
        ex.Calibrate(x.data() + s * per, std::min({batch, n - s, calibrate - s}), channels, size, size);
    ex.Features(x.data(), std::min(batch, n), channels, size, size);  // warm-up: primitives created
    std::vector<double> secs;
    for (int r = 0; r < reps; ++r) {
      out.clear();
      const auto t0 = std::chrono::steady_clock::now();
      for (int64_t s = 0; s < n; s += batch) {
        const int64_t b = std::min(batch, n - s);
        std::vector<float> f = ex.Features(x.data() + s * per, b, channels, size, size);
        dim = static_cast<int64_t>(f.size()) / b;
        out.insert(out.end(), f.begin(), f.end());
      }
      secs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    if (!output.empty()) {
      std::ofstream f(output, std::ios::binary);
      f.write(reinterpret_cast<const char*>(out.data()), static_cast<std::streamsize>(out.size() * sizeof(float)));
    }
    const double s = bench::Median(secs);
    constexpr int64_t kG = 2048;
    std::vector<float> a(kG * kG, 0.5f), b(kG * kG, 0.25f), c(kG * kG);
    kernels::Gemm(false, false, kG, kG, kG, 1.f, a.data(), kG, b.data(), kG, 0.f, c.data(), kG);
    std::vector<double> gsecs;
    for (int r = 0; r < 5; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      kernels::Gemm(false, false, kG, kG, kG, 1.f, a.data(), kG, b.data(), kG, 0.f, c.data(), kG);
      gsecs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    const double gflops = 2.0 * kG * kG * kG / bench::Median(gsecs) / 1e9;
    bench::PrintJsonLine({{"images_per_s", static_cast<double>(n) / s}, {"seconds", s}, {"dim", dim},
                                        {"batch", batch}, {"sgemm_gflops", gflops},
                          {"precision", precision}});
  });
}
