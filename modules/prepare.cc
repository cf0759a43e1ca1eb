// Step 2a (DAM): images prepared for each backbone and run through it once per dataset split;
// the features go to the NAM under a content key. Sharded: the images are cut into batches of
// kBatch, each rank computes a contiguous run of whole batches, and rank 0 gathers and commits
// the object once, so it is byte-identical for any number of ranks.
#include <fmt/core.h>

#include <chrono>
#include <map>

#include "kernels/dataset.h"
#include "kernels/executor.h"
#include "kernels/onnx_graph.h"
#include "kernels/prepare.h"
#include "modules/features.h"
#include "workflow/objects.h"

namespace msaflow::modules {
namespace {

constexpr int64_t kBatch = 64;

// Features of images [lo, hi) of `ds` (n x dim floats).
std::vector<float> ComputeRows(StepContext& c, const workflow::BackboneSpec& bb, kernels::Executor* ex,
                               const kernels::ImageSet& ds, int64_t lo, int64_t hi, int64_t dim,
                               const std::string& label) {
  std::vector<float> feats(static_cast<size_t>((hi - lo) * dim));
  const int64_t px = ds.rows * ds.cols;
  if (bb.kind == "pixels") {
    for (size_t i = 0; i < feats.size(); ++i) feats[i] = ds.pixels[static_cast<size_t>(lo * px) + i] / 255.f;
    return feats;
  }
  const auto& in = bb.input;
  std::vector<float> batch(static_cast<size_t>(kBatch * in.channels * in.height * in.width));
  int64_t next_report = lo + (hi - lo) / 4;
  for (int64_t s = lo; s < hi; s += kBatch) {
    int64_t b = std::min(kBatch, hi - s);
    kernels::PrepareBatch(ds.pixels.data() + s * px, b, ds.rows, ds.cols, in, batch.data());
    auto f = ex->Features(batch.data(), b, in.channels, in.height, in.width);
    std::copy(f.begin(), f.end(), feats.begin() + (s - lo) * dim);
    if (s + b >= next_report && s + b < hi) {
      c.Say(fmt::format("progress: features {} {}/{} images", label, s + b - lo, hi - lo));
      next_report += (hi - lo) / 4;
    }
  }
  return feats;
}

}  // namespace

void Prepare(StepContext& c) {
  const int rank = c.comm->rank(), size = c.comm->size();
  nlohmann::json summary = {{"computed", nlohmann::json::array()}, {"reused", nlohmann::json::array()}};
  std::map<std::string, kernels::ImageSet> data;
  for (const std::string split : {"train", "test"}) {
    const auto& s = Split(c.pipeline(), split);
    data[split] = kernels::ReadIdx(s.images, s.labels, s.limit);
  }
  for (const auto& bb : c.pipeline().backbones) {
    std::string bb_digest = BackboneDigest(*c.store, bb);
    std::unique_ptr<kernels::Executor> ex;
    for (const std::string split : {"train", "test"}) {
      const kernels::ImageSet& ds = data[split];
      std::string key = workflow::FeaturesObject(bb_digest, ds.Digest());
      nlohmann::json entry = {{"backbone", bb.name}, {"split", split}, {"object", key}, {"rows", ds.count}};
      int reuse = c.root() && c.store->Stat(key) ? 1 : 0;  // rank 0 decides for all
      c.comm->Bcast(&reuse, sizeof reuse, 0);
      if (reuse) {
        if (c.root()) c.Say(fmt::format("features {}/{}: reused {} (backbone not run)", bb.name, split, key));
        summary["reused"].push_back(entry);
        continue;
      }
      auto t0 = std::chrono::steady_clock::now();
      int64_t dim = ds.rows * ds.cols;
      if (bb.kind != "pixels") {
        if (!ex) {
          nam::Object o = c.store->Get(workflow::BackboneObject(bb.name));
          ex = std::make_unique<kernels::Executor>(kernels::ImportOnnx(o.bytes, "NAM " + o.info.name, bb.feature_layer));
        }
        dim = ex->FeatureDim(bb.input.channels, bb.input.height, bb.input.width);
      }
      // This rank's contiguous run of whole batches.
      const int64_t batches = (ds.count + kBatch - 1) / kBatch;
      const int64_t lo = std::min(ds.count, batches * rank / size * kBatch);
      const int64_t hi = std::min(ds.count, batches * (rank + 1) / size * kBatch);
      std::vector<float> mine = ComputeRows(c, bb, ex.get(), ds, lo, hi, dim, bb.name + "/" + split);
      double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (size > 1)
        c.Say(fmt::format("features {}/{}: images [{}, {}) in {:.2f} s", bb.name, split, lo, hi, secs));
      auto parts = c.comm->Gather(
          std::string(reinterpret_cast<const char*>(mine.data()), mine.size() * sizeof(float)), 0);
      if (c.root()) {
        std::vector<float> feats(static_cast<size_t>(ds.count * dim));
        size_t off = 0;
        for (const auto& p : parts) {
          std::memcpy(reinterpret_cast<char*>(feats.data()) + off, p.data(), p.size());
          off += p.size();
        }
        secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        nlohmann::json meta = {{"rows", ds.count},         {"dim", dim},     {"classes", ds.classes()},
                               {"backbone", bb.name},      {"backbone_digest", bb_digest},
                               {"dataset_digest", ds.Digest()}, {"split", split}};
        c.store->Put(key, EncodeFeatures(ds.labels, feats), meta);
        c.Say(fmt::format("features {}/{}: computed {} x {} on {} rank{} in {:.1f} s ({:.2f} ms/image) -> {}", bb.name,
                          split, ds.count, dim, size, size > 1 ? "s" : "", secs,
                          1e3 * secs / static_cast<double>(ds.count), key));
      }
      entry["seconds"] = secs;
      entry["ranks"] = size;
      summary["computed"].push_back(entry);
    }
  }
  if (c.root())
    c.store->Put(workflow::PreparedObject(c.task.run, c.task.round), summary.dump(), {{"kind", "prepare-summary"}});
  c.comm->Barrier();  // no rank reports success before the features are committed
}

}  // namespace msaflow::modules
