// Fine-tuning's training step on one rank, for bench/finetune.py: a model's tail and a softmax
// head trained together (parallel::FinetuneSync on one rank) on maps the trunk computed from
// random images, timed after a warm-up epoch. One JSON line: images/s of forward + backward +
// update, the step's seconds, the tail's nodes, inputs and weights.
//   bench_finetune --model M.onnx --cut LAYER --from LAYER [--batch 64] [--steps 20] [--size 96]
//   bench_finetune ... --describe     the tail's nodes, inputs (with dims) and params only
//   bench_finetune ... --stream-parts N --msaflow EXE [--epochs E] [--reps R]
//       also the same training with the maps streamed from a NAM server (EXE nam serve, tcp on
//       loopback) by modules::MapsSource within N parts (as prepare cuts them), interleaved with
//       the maps in memory, R times each: both figures, the reads and the waits.
#include <CLI/CLI.hpp>
#include <filesystem>
#include <random>

#include "bench/bench_util.h"
#include "common/files.h"
#include "kernels/executor.h"
#include "kernels/onnx_graph.h"
#include "modules/finetune_maps.h"
#include "nam/store.h"
#include "parallel/finetune.h"
#include "workflow/objects.h"

using namespace msaflow;

int main(int argc, char** argv) {
  CLI::App app{"fine-tuning's training step on one rank"};
  std::string model, cut, from;
  int64_t batch = 64, steps = 20, size = 96, classes = 10, stream_parts = 0, epochs = 1, reps = 3;
  std::string exe;
  bool describe = false;
  app.add_option("--model", model)->required();
  app.add_option("--cut", cut)->required();
  app.add_option("--from", from)->required();
  app.add_option("--batch", batch);
  app.add_option("--steps", steps);
  app.add_option("--size", size);
  app.add_flag("--describe", describe);
  app.add_option("--stream-parts", stream_parts);
  app.add_option("--msaflow", exe);
  app.add_option("--epochs", epochs);
  app.add_option("--reps", reps);
  CLI11_PARSE(app, argc, argv);
  return bench::ReportErrors("bench_finetune", [&] {
    const std::string bytes = ReadFile(model);
    kernels::Graph whole = kernels::ImportOnnx(bytes, model, cut);
    kernels::Tail tail(whole, from);
    kernels::Executor trunk(kernels::ImportOnnxCuts(bytes, model, tail.inputs()));
    // The trunk's maps of `batch` random images, repeated: the step's cost does not depend on
    // which rows it trains on.
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> u(0.f, 1.f);
    std::vector<float> images(static_cast<size_t>(batch * 3 * size * size));
    for (auto& v : images) v = u(rng);
    std::vector<kernels::TensorDims> dims;
    const auto maps = trunk.Maps(images.data(), batch, 3, size, size, &dims);
    nlohmann::json params = nlohmann::json::array(), inputs = nlohmann::json::array();
    for (const auto& p : tail.params()) params.push_back({{"name", p.name}, {"dims", p.dims}});
    for (size_t i = 0; i < dims.size(); ++i) inputs.push_back({{"name", tail.inputs()[i]}, {"dims", dims[i]}});
    nlohmann::json out = {
        {"nodes", tail.NodeNames()}, {"inputs", inputs}, {"params", params}, {"tail_weights", tail.ParamCount()}};
    if (describe) {
      bench::PrintJsonLine(out);
      return;
    }
    const int64_t n = batch * steps;
    std::vector<std::vector<float>> rows(maps.size());
    parallel::FinetuneArrays data;
    for (size_t i = 0; i < maps.size(); ++i) {
      for (int64_t k = 0; k < steps; ++k) rows[i].insert(rows[i].end(), maps[i].begin(), maps[i].end());
      data.maps.push_back(rows[i].data());
      data.dims.emplace_back(dims[i].begin() + 1, dims[i].end());
    }
    std::vector<uint8_t> labels(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) labels[static_cast<size_t>(i)] = static_cast<uint8_t>(i % classes);
    data.y = labels.data();
    data.n = n;
    const std::vector<float> feats = parallel::TailFeatures(&tail, data, batch);
    kernels::HeadConfig cfg;
    cfg.batch = batch;
    cfg.epochs = 1;
    kernels::Head h = kernels::InitHead(cfg, feats.data(), labels.data(), n, tail.FeatureDim(), classes);
    parallel::SelfComm self;
    parallel::FinetuneSync(self, data, &tail, &h, {});  // warm-up: primitives created, buffers sized
    const parallel::TrainStats st = parallel::FinetuneSync(self, data, &tail, &h, {});
    out["images_per_s"] = static_cast<double>(n) / st.seconds;
    out["step_seconds"] = st.seconds / static_cast<double>(steps);
    out["batch"] = batch;
    out["steps"] = steps;
    if (stream_parts > 0) {
      if (exe.empty()) Throw(ErrorKind::kInvalidInput, "--stream-parts needs --msaflow EXE (it starts the NAM server)");
      const std::string dir =
          std::filesystem::temp_directory_path() / ("msaflow-bench-finetune-" + std::to_string(getpid()));
      MakeDirs(dir);
      const std::string ready = dir + "/ready.json", log = dir + "/nam.log";
      bench::Child server;
      server.Start({exe, "nam", "serve", "--listen", "127.0.0.1:" + std::to_string(18000 + getpid() % 20000),
                    "--provider", "tcp", "--capacity", "4GiB", "--ready-file", ready},
                   log);
      const std::unique_ptr<nam::Store> store = nam::OpenStore(bench::WaitReady(ready, server, log));
      int64_t row = 0;
      for (const auto& d : data.dims) row += kernels::NumElements(d);
      const int64_t part_rows = workflow::FeaturesPartRows(row, workflow::kMapsBatch, workflow::FeaturesPartBytes());
      const int64_t bytes = modules::PutMapsArrays(*store, "maps/bench", data, tail.inputs(), classes, part_rows);
      const int64_t limit = stream_parts * part_rows * row * static_cast<int64_t>(sizeof(float));
      cfg.epochs = h.config.epochs = epochs;
      std::vector<double> whole_s, streamed_s, waited;
      int64_t parts_read = 0, peak = 0, window = 0;
      for (int64_t r = 0; r < reps; ++r) {  // interleaved: the machine's drift falls on both
        whole_s.push_back(parallel::FinetuneSync(self, data, &tail, &h, {}).seconds);
        modules::MapsSource streamed(*store, "maps/bench", limit);
        if (!streamed.streamed()) Throw(ErrorKind::kInvalidInput, "--stream-parts: the maps fit, nothing streams");
        streamed_s.push_back(parallel::FinetuneSync(self, streamed, &tail, &h, {}).seconds);
        const auto st2 = streamed.stats();
        waited.push_back(st2.wait_seconds);
        parts_read = st2.parts_read;
        peak = st2.peak_bytes;
        window = streamed.window_parts();
      }
      const double images = static_cast<double>(n * epochs);
      out["streamed"] = {{"nam", "tcp on loopback"},
                         {"epochs", epochs},
                         {"maps_bytes", bytes},
                         {"part_rows", part_rows},
                         {"limit_bytes", limit},
                         {"window_parts", window},
                         {"whole_images_per_s", images / bench::Median(whole_s)},
                         {"streamed_images_per_s", images / bench::Median(streamed_s)},
                         {"wait_seconds", bench::Median(waited)},
                         {"parts_read", parts_read},
                         {"peak_bytes", peak}};
      server.Stop();
      std::filesystem::remove_all(dir);
    }
    bench::PrintJsonLine(out);
  });
}
