// Fine-tuning under a real MPI launcher, for tests/integration/finetune_test.py:
//   [mpirun -n N] finetune_ranks MODEL.onnx CUT TRAIN_FROM OUT_DIR [EPOCHS [MODE [BUCKET_BYTES [BATCH
//                                 [STREAM_PARTS]]]]]
// MODE: sync (the default), async (rank 0 the server, the others workers), async2 (ranks 0 and 1
// servers, each a slice of the head-and-tail vector) or hybrid (rank 0 the server, the workers in
// groups of 2); BUCKET_BYTES: sync's bucket size (0: one sum after the
// backward pass); BATCH: the global batch (default 32); STREAM_PARTS > 0: the maps are put in a
// NAM (mem://, each rank its own) in parts of 16 rows and streamed through modules::MapsSource
// within that many parts' bytes (0, the default: read from memory), its stats in result.json.
// Every rank makes the same small image set (four classes of coloured patterns with noise), runs
// the frozen trunk over it once (Executor::Maps at the freeze point), initialises a softmax head
// on the tail's pooled features and fine-tunes tail and head together (parallel::FinetuneSync, or
// parallel::FinetuneParameterServer).
// Rank 0 writes OUT_DIR/weights.f32 (every tail weight, then the head's parameters, float32)
// and OUT_DIR/result.json (the curve, the tail's size and the training stats).
#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>

#include "common/error.h"
#include "common/files.h"
#include "kernels/executor.h"
#include "kernels/onnx_graph.h"
#include "modules/features.h"
#include "modules/finetune_maps.h"
#include "nam/store.h"
#include "parallel/finetune.h"
#include "parallel/mpi_comm.h"
#include "workflow/objects.h"

using namespace msaflow;

namespace {

constexpr int64_t kImages = 192, kSize = 64, kClasses = 4;

// Image i: class i % 4 lights one quadrant in one colour, over uniform noise of a random tint and
// contrast per image and channel (without them every image pools to nearly the same features,
// and the head's standardisation, 1 / their tiny spread, made a tail's every change enormous).
std::vector<float> Images(std::vector<uint8_t>* labels) {
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> noise(0.f, 0.6f), tint(0.f, 0.5f), contrast(0.3f, 1.f);
  std::vector<float> x(static_cast<size_t>(kImages * 3 * kSize * kSize));
  labels->resize(kImages);
  for (int64_t i = 0; i < kImages; ++i) {
    const int64_t k = i % kClasses;
    (*labels)[static_cast<size_t>(i)] = static_cast<uint8_t>(k);
    for (int64_t c = 0; c < 3; ++c) {
      const float base = tint(rng), gain = contrast(rng);
      for (int64_t y = 0; y < kSize; ++y)
        for (int64_t z = 0; z < kSize; ++z) {
          const bool lit = (y < kSize / 2) == (k < 2) && (z < kSize / 2) == (k % 2 == 0) && c == k % 3;
          x[static_cast<size_t>(((i * 3 + c) * kSize + y) * kSize + z)] = base + gain * noise(rng) + (lit ? 0.4f : 0.f);
        }
    }
  }
  return x;
}

int64_t RowFloats(const parallel::FinetuneArrays& a) {
  int64_t row = 0;
  for (const auto& d : a.dims) row += kernels::NumElements(d);
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  parallel::MpiSession mpi(&argc, &argv);
  if (argc < 5) {
    std::cerr << "usage: finetune_ranks MODEL.onnx CUT TRAIN_FROM OUT_DIR [EPOCHS [MODE [BUCKET_BYTES [BATCH]]]]\n";
    return 2;
  }
  try {
    parallel::Comm& world = mpi.world();
    const std::string bytes = ReadFile(argv[1]);
    kernels::Graph whole = kernels::ImportOnnx(bytes, argv[1], argv[2]);
    kernels::Tail tail(whole, argv[3]);
    kernels::Executor trunk(kernels::ImportOnnxCuts(bytes, argv[1], tail.inputs()));
    std::vector<uint8_t> labels;
    const std::vector<float> images = Images(&labels);
    // The trunk's maps, 32 images at a time, concatenated per input.
    std::vector<std::vector<float>> maps(tail.inputs().size());
    std::vector<kernels::TensorDims> row_dims;
    const int64_t per_image = 3 * kSize * kSize;
    for (int64_t lo = 0; lo < kImages; lo += 32) {
      std::vector<kernels::TensorDims> dims;
      auto m = trunk.Maps(&images[static_cast<size_t>(lo * per_image)], 32, 3, kSize, kSize, &dims);
      for (size_t i = 0; i < m.size(); ++i) maps[i].insert(maps[i].end(), m[i].begin(), m[i].end());
      row_dims.clear();
      for (auto d : dims) row_dims.emplace_back(d.begin() + 1, d.end());
    }
    parallel::FinetuneArrays arrays;
    for (const auto& m : maps) arrays.maps.push_back(m.data());
    arrays.dims = row_dims;
    arrays.y = labels.data();
    arrays.n = kImages;
    const int64_t stream_parts = argc > 9 ? std::stoll(argv[9]) : 0;
    std::unique_ptr<nam::Store> store;
    std::unique_ptr<modules::MapsSource> streamed;
    if (stream_parts > 0) {
      store = nam::OpenStore("mem://finetune-ranks");
      const int64_t part_rows = 16;
      modules::PutMapsArrays(*store, "maps/test", arrays, tail.inputs(), kClasses, part_rows);
      streamed =
          std::make_unique<modules::MapsSource>(*store, "maps/test", stream_parts * part_rows * RowFloats(arrays) * 4);
      if (!streamed->streamed()) Throw(ErrorKind::kInternal, "the maps fit in STREAM_PARTS parts: not streamed");
    }
    parallel::FinetuneData& data = streamed ? static_cast<parallel::FinetuneData&>(*streamed) : arrays;
    const std::vector<float> feats = parallel::TailFeatures(&tail, data, 64);
    kernels::HeadConfig cfg;
    cfg.type = "softmax";
    cfg.optimizer = "adam";
    cfg.lr = 1e-3;
    cfg.epochs = argc > 5 ? std::stoll(argv[5]) : 3;
    cfg.batch = argc > 8 ? std::stoll(argv[8]) : 32;
    cfg.seed = 3;
    cfg.data_seed = 5;
    kernels::Head h = kernels::InitHead(cfg, feats.data(), labels.data(), kImages, tail.FeatureDim(), kClasses);
    std::vector<float> before;
    for (const auto& p : tail.params()) before.insert(before.end(), p.value.begin(), p.value.end());
    parallel::FinetuneOptions opt;
    opt.backbone_lr_scale = 0.1;
    const std::string mode = argc > 6 ? argv[6] : "sync";
    if (argc > 7) opt.bucket_bytes = std::stoull(argv[7]);
    parallel::TrainStats st;
    if (mode == "sync") {
      st = parallel::FinetuneSync(world, data, &tail, &h, opt);
    } else if (mode == "async" || mode == "hybrid" || mode == "async2") {
      parallel::PsOptions ps;
      ps.servers = mode == "async2" ? 2 : 1;
      ps.groups = mode == "hybrid" ? (world.size() - 1) / 2 : 0;
      st = parallel::FinetuneParameterServer(world, data, &tail, &h, opt, ps);
    } else {
      Throw(ErrorKind::kInvalidInput, "MODE: expected sync, async, async2 or hybrid, got '" + mode + "'");
    }
    if (world.rank() == 0) {
      std::vector<float> w;
      for (const auto& p : tail.params()) w.insert(w.end(), p.value.begin(), p.value.end());
      const size_t tail_size = w.size();
      double moved = 0, norm = 0;  // how far training moved the tail, relative
      for (size_t i = 0; i < tail_size; ++i) {
        moved += (w[i] - before[i]) * (w[i] - before[i]);
        norm += before[i] * before[i];
      }
      w.insert(w.end(), h.params.begin(), h.params.end());
      std::ofstream(std::string(argv[4]) + "/weights.f32", std::ios::binary)
          .write(reinterpret_cast<const char*>(w.data()), static_cast<std::streamsize>(w.size() * sizeof(float)));
      nlohmann::json curve = nlohmann::json::array();
      for (const auto& p : h.curve) curve.push_back({{"loss", p.loss}, {"accuracy", p.accuracy}});
      nlohmann::json out = {{"curve", curve},
                            {"tail_weights", tail_size},
                            {"tail_moved", std::sqrt(moved / norm)},
                            {"training", st.ToJson()}};
      if (streamed) {
        const auto ms = streamed->stats();
        out["maps"] = {{"parts_read", ms.parts_read},
                       {"peak_bytes", ms.peak_bytes},
                       {"part_bytes", streamed->part_bytes()},
                       {"window_parts", streamed->window_parts()}};
      }
      std::ofstream(std::string(argv[4]) + "/result.json") << out.dump() << "\n";
    }
    return 0;
  } catch (const Error& e) {
    std::cerr << "finetune_ranks: " << e.what() << "\n";
    mpi.AbortIfParallel(3);
    return 3;
  }
}
