// Step 2a (DAM): images prepared for each backbone and run through it once per dataset split;
// the features go to the NAM under a content key (modules/features.h). Sharded by parts: the
// rows are cut into parts of whole 64-image batches, each rank computes a contiguous run of
// parts and writes them itself, and rank 0 writes the features object last, once every part
// is in; the objects are byte-identical for any number of ranks. The data manager overlaps
// the work: batch i + 1 is prepared (the FPGA's job on the DAM) while the backbone runs on
// batch i, and a finished part is written to the NAM while the next one is computed. Batches
// are prepared on the task's FPGA backend (kernels/fpga/device.h); the results give the time
// measured here and, when the machine file describes the target board, the modelled time there.
#include <fmt/core.h>

#include <chrono>
#include <cstring>
#include <map>

#include "kernels/dataset.h"
#include "kernels/executor.h"
#include "kernels/fpga/device.h"
#include "kernels/onnx_graph.h"
#include "common/error.h"
#include "workflow/datasets.h"
#include "modules/calibration.h"
#include "modules/features.h"
#include "workflow/objects.h"

namespace msaflow::modules {
namespace {

constexpr int64_t kBatch = 64;

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The images a backbone runs on at once: 64, or the fixed batch its model was exported with
// (input.batch; the last batch is then padded to it).
int64_t BatchOf(const workflow::BackboneSpec& bb) { return bb.input.batch > 0 ? bb.input.batch : kBatch; }

// What one rank did for one (backbone, split).
struct PartWork {
  int64_t rows = 0, parts = 0;
  OverlapStats batches;  // fetch: preparing a batch; consume: the backbone on it
  double put_s = 0;      // writing parts to the NAM
  double put_wait_s = 0; // ... the part of it the computation waited for
};

// Computes parts [p0, p1) of `idx` from `ds` (the images of those parts' rows, the first being
// row idx.PartLo(p0)) and writes each part to the NAM as it is finished.
PartWork ComputeParts(StepContext& c, const workflow::BackboneSpec& bb, kernels::Executor* ex,
                      const kernels::ImageSet& ds, const FeaturesIndex& idx, int64_t p0, int64_t p1,
                      const std::string& label) {
  PartWork w;
  if (p0 >= p1) return w;
  const int64_t lo = idx.PartLo(p0), hi = idx.PartHi(p1 - 1), dim = idx.dim;
  w.rows = hi - lo;
  w.parts = p1 - p0;
  std::vector<float> out[2];  // part p is built in out[p % 2] while out[(p - 1) % 2] is written
  for (auto& o : out) o.resize(static_cast<size_t>(idx.part_rows * dim));
  Worker writer;  // writes part p while part p + 1 is computed; declared after `out`, so it
                  // finishes (its destructor waits) before the buffers go
  auto finish_write = [&] {
    auto t0 = Clock::now();
    writer.Wait();  // rethrows a failed write
    w.put_wait_s += Since(t0);
  };
  std::vector<uint16_t> halves[2];  // float16 features: part p narrowed into halves[p % 2]
  auto write_part = [&](int64_t p) {
    finish_write();
    const size_t values = static_cast<size_t>((idx.PartHi(p) - idx.PartLo(p)) * dim);
    std::string_view data(reinterpret_cast<const char*>(out[p % 2].data()), values * sizeof(float));
    if (idx.half) {
      NarrowFeatures(bb.name, out[p % 2].data(), values, halves[p % 2]);
      data = std::string_view(reinterpret_cast<const char*>(halves[p % 2].data()), values * sizeof(uint16_t));
    }
    auto put = [&c, &idx, &w, p, data] {
      auto t0 = Clock::now();
      c.store->Put(workflow::FeaturesPartObject(idx.object, p), data,
                   {{"kind", "features-part"}, {"part", p}, {"rows", idx.PartHi(p) - idx.PartLo(p)}, {"dim", idx.dim}});
      w.put_s += Since(t0);
    };
    if (c.overlap != OverlapMode::kOff) {  // a write needs no result back: always behind the computing
      writer.Submit(put);
    } else {
      auto t0 = Clock::now();
      put();
      w.put_wait_s += Since(t0);
    }
  };
  if (!bb.prepared()) {  // raw pixels as read: the bytes / 255
    for (int64_t p = p0; p < p1; ++p) {
      auto t0 = Clock::now();
      float* o = out[p % 2].data();
      const uint8_t* src = ds.Image(idx.PartLo(p) - lo);
      for (int64_t i = 0, m = (idx.PartHi(p) - idx.PartLo(p)) * dim; i < m; ++i) o[i] = static_cast<float>(src[i]) / 255.f;
      w.batches.consume_s += Since(t0);
      write_part(p);
    }
  } else {
    const auto& in = bb.input;
    kernels::fpga::Device* fpga = &c.Fpga();  // opened here, before the data manager's thread uses it
    const int64_t B = BatchOf(bb), per = in.channels * in.height * in.width;
    const int64_t batches = (hi - lo + B - 1) / B;
    std::vector<float> batch[2];
    for (auto& b : batch) b.resize(static_cast<size_t>(B * per));
    int64_t next_report = batches / 4;
    w.batches = Overlap(
        batches,
        [&](int64_t i) {
          const int64_t s = lo + i * B, b = std::min(B, hi - s);
          kernels::fpga::PrepareImages(*fpga, ds, lo, s, b, in, batch[i % 2].data());
          if (in.batch > 0 && b < B)  // a model with a fixed batch gets whole batches: zeros after the last image
            std::fill(batch[i % 2].begin() + b * per, batch[i % 2].end(), 0.f);
        },
        [&](int64_t i) {
          const int64_t s = lo + i * B, b = std::min(B, hi - s);
          const int64_t p = s / idx.part_rows;
          float* to = out[p % 2].data() + (s - idx.PartLo(p)) * dim;
          if (ex) {
            auto f = ex->Features(batch[i % 2].data(), in.batch > 0 ? B : b, in.channels, in.height, in.width);
            std::copy(f.begin(), f.begin() + b * dim, to);
          } else {  // resized raw pixels: the prepared images are the features
            std::copy(batch[i % 2].begin(), batch[i % 2].begin() + b * dim, to);
          }
          if (s + b == idx.PartHi(p)) write_part(p);
          if (i + 1 == next_report && i + 1 < batches) {
            c.Say(fmt::format("progress: features {} {}/{} images", label, s + b - lo, hi - lo));
            next_report += batches / 4;
          }
        },
        c.Overlapping("image batches " + bb.name));
  }
  finish_write();
  return w;
}

// The preparation time measured on every rank, and what the target board would take
// (kernels/fpga/cost_model.h), for one (backbone, split).
nlohmann::json PrepareFpgaTimes(const StepContext& c, const workflow::BackboneSpec& bb, const workflow::SplitSource& src,
                                const kernels::ImageSet& mine, const std::vector<std::string>& per_rank) {
  double measured = 0;
  for (const auto& s : per_rank) measured += nlohmann::json::parse(s).value("prepare_s", 0.0);
  const int64_t n = src.count();
  nlohmann::json j = {{"images", n}, {"measured_s", measured},
                      {"images_per_s", measured > 0 ? static_cast<double>(n) / measured : 0.0}};
  const auto& t = c.task.fpga.target;
  if (t.given()) {
    const auto& in = bb.input;
    // Rank 0's images stand for the size of them all (an image folder's sizes vary).
    const int64_t r = mine.count ? mine.Rows(0) : in.height, k = mine.count ? mine.Cols(0) : in.width;
    auto m = kernels::fpga::ModelPrepare(t, n, r, k, mine.channels, in.height, in.width, in.channels, 4);
    j["modelled"] = {{"seconds", m.seconds()}, {"bound", m.bound()}, {"target", t.name},
                     {"note", "modelled from the machine file's target figures, not measured"}};
  }
  return j;
}

}  // namespace

namespace {

// When every backbone's features of every split are in the NAM already (their keys from the
// cached dataset digests), prepare reads no image at all: the reused entries go to `summary`
// and true is returned on every rank. Rank 0 decides.
bool EverythingReused(StepContext& c, nlohmann::json* summary) {
  int all = 0;
  nlohmann::json reused = nlohmann::json::array();
  if (c.root()) {
    all = 1;
    for (const auto& bb : c.pipeline().backbones) {
      const std::string bb_digest = BackboneDigest(*c.store, bb);
      for (const std::string& split : workflow::SplitNames(c.pipeline())) {
        const std::string key = workflow::FeaturesObject(bb_digest, c.DatasetDigest(split));
        const auto info = c.store->Stat(key);
        if (!info || !info->meta.contains("part_rows")) {
          all = 0;
          break;
        }
        reused.push_back({{"backbone", bb.name}, {"split", split}, {"object", key},
                          {"rows", info->meta.value("rows", int64_t{0})}});
      }
      if (!all) break;
    }
  }
  c.comm->Bcast(&all, sizeof all, 0);
  if (!all || !c.root()) return all == 1;
  for (const auto& bb : c.pipeline().backbones) c.inputs["backbones"][bb.name] = BackboneDigest(*c.store, bb);
  for (const std::string& split : workflow::SplitNames(c.pipeline())) c.inputs["datasets"][split] = c.DatasetDigest(split);
  for (const auto& e : reused)
    c.Say(fmt::format("features {}/{}: reused {} (backbone not run)", e["backbone"].get<std::string>(),
                      e["split"].get<std::string>(), e["object"].get<std::string>()));
  c.Say(fmt::format("every features object was there: no image read ({} of {} dataset digest(s) from the cache)",
                    c.digest_cache_hits(), workflow::SplitNames(c.pipeline()).size()));
  (*summary)["reused"] = std::move(reused);
  return true;
}

// A split's dataset digest, recorded among the step's inputs. Looking for reusable features
// may have hashed the split already (not twice).
std::string DatasetDigest(StepContext& c, const workflow::SplitSource& src) {
  const std::string& split = src.name();
  std::string digest;
  if (const std::string* known = c.KnownDatasetDigest(split)) {
    digest = *known;
  } else {
    digest = src.Digest();
    c.RememberDatasetDigest(split, digest);
  }
  c.inputs["datasets"][split] = digest;
  return digest;
}

// The width of backbone `bb`'s features: raw pixels' row size, or the cut tensor's channels of
// the backbone's executor (built from the NAM's copy on first use, int8 with the load step's
// ranges, the same for every rank).
int64_t FeatureDim(StepContext& c, const workflow::BackboneSpec& bb, const workflow::SplitSource& src,
                   std::unique_ptr<kernels::Executor>& ex) {
  if (bb.kind == "pixels") {
    if (bb.prepared()) return bb.input.channels * bb.input.height * bb.input.width;
    kernels::ImageSet first = src.Read(0, 1);
    if (!first.uniform())
      Throw(ErrorKind::kInvalidInput, "backbone '" + bb.name + "' (raw pixels) needs images of one size; " +
                                          src.Where(-1) + " is an image folder, whose sizes may vary: give the backbone "
                                          "an \"input\": {\"height\", \"width\"} to resize them to");
    return first.rows * first.cols * first.channels;
  }
  if (!ex) {
    nam::Object o = c.store->Get(workflow::BackboneObject(bb.name));
    ex = std::make_unique<kernels::Executor>(kernels::ImportOnnx(o.bytes, "NAM " + o.info.name, bb.feature_layer),
                                             kernels::ParsePrecision(bb.precision));
    if (bb.precision == "int8")
      ex->SetRanges(RangesFromJson(o.info.meta.value("int8_ranges", nlohmann::json()), "NAM object '" + o.info.name + "'"));
  }
  return ex->FeatureDim(bb.input.channels, bb.input.height, bb.input.width);
}

}  // namespace

void Prepare(StepContext& c) {
  const int rank = c.comm->rank(), size = c.comm->size();
  nlohmann::json summary = {{"computed", nlohmann::json::array()}, {"reused", nlohmann::json::array()},
                            {"overlap", OverlapModeName(c.overlap)}};
  if (EverythingReused(c, &summary)) {
    summary["fpga"] = c.FpgaReport();
    if (c.root())
      c.store->Put(workflow::PreparedObject(c.task.run, c.task.round), summary.dump(), {{"kind", "prepare-summary"}});
    c.comm->Barrier();
    return;
  }
  c.WorkAhead();
  const int64_t part_bytes = FeaturesPartBytes();
  // Every split's labels, checked before anything is computed; the pixels are read per rank.
  const std::vector<workflow::SplitSource> splits = workflow::OpenSplits(c.pipeline());
  const int64_t classes = workflow::CheckSplits(c.pipeline(), splits);
  std::map<std::string, std::string> digests;
  for (const auto& bb : c.pipeline().backbones) {
    std::string bb_digest = BackboneDigest(*c.store, bb);
    c.inputs["backbones"][bb.name] = bb_digest;
    std::unique_ptr<kernels::Executor> ex;
    for (const workflow::SplitSource& src : splits) {
      const std::string& split = src.name();
      if (!digests.count(split)) digests[split] = DatasetDigest(c, src);
      std::string key = workflow::FeaturesObject(bb_digest, digests[split]);
      nlohmann::json entry = {{"backbone", bb.name}, {"split", split}, {"object", key}, {"rows", src.count()}};
      int reuse = 0;  // rank 0 decides for all
      if (c.root()) {
        auto info = c.store->Stat(key);
        // Features written before they came in parts have no part_rows: computed again.
        reuse = info && info->meta.contains("part_rows") ? 1 : 0;
        if (info && !reuse) c.Say(fmt::format("features {}/{}: {} is in an older layout; computing it again", bb.name, split, key));
      }
      c.comm->Bcast(&reuse, sizeof reuse, 0);
      if (reuse) {
        if (c.root()) c.Say(fmt::format("features {}/{}: reused {} (backbone not run)", bb.name, split, key));
        summary["reused"].push_back(entry);
        continue;
      }
      auto t0 = Clock::now();
      const int64_t dim = FeatureDim(c, bb, src, ex);
      FeaturesIndex idx;
      idx.object = key;
      idx.n = src.count();
      idx.dim = dim;
      idx.part_rows = FeaturesPartRows(dim, BatchOf(bb), part_bytes);
      idx.parts = (idx.n + idx.part_rows - 1) / idx.part_rows;
      idx.half = bb.feature_dtype == "f16";
      // This rank's contiguous run of parts.
      const int64_t p0 = idx.parts * rank / size, p1 = idx.parts * (rank + 1) / size;
      // Only this rank's images are read (an image folder decodes only these).
      const kernels::ImageSet ds = p0 < p1 ? src.Read(idx.PartLo(p0), idx.PartHi(p1 - 1)) : kernels::ImageSet{};
      PartWork w = ComputeParts(c, bb, ex.get(), ds, idx, p0, p1, bb.name + "/" + split);
      double secs = Since(t0);
      if (size > 1)
        c.Say(fmt::format("features {}/{}: images [{}, {}) in {:.2f} s", bb.name, split, idx.PartLo(p0),
                          idx.PartLo(p0) + w.rows, secs));
      nlohmann::json mine = {{"rank", rank},
                             {"rows", w.rows},
                             {"parts", w.parts},
                             {"seconds", secs},
                             {"prepare_s", w.batches.fetch_s},
                             {"backbone_s", w.batches.consume_s},
                             {"prepare_wait_s", w.batches.wait_s},
                             {"put_s", w.put_s},
                             {"put_wait_s", w.put_wait_s}};
      if (bb.prepared()) mine["overlap"] = c.OverlapReport()["image batches " + bb.name];
      auto stats = c.comm->Gather(mine.dump(), 0);  // after every rank's parts are in the NAM
      if (c.root()) {
        nlohmann::json meta = FeaturesMeta(src.count(), dim, classes, idx.part_rows, idx.half);
        meta.update({{"backbone", bb.name}, {"backbone_digest", bb_digest}, {"dataset_digest", digests[split]},
                     {"split", split}});
        if (!src.class_names().empty()) meta["class_names"] = src.class_names();
        const auto& labels = src.labels();
        c.store->Put(key, std::string_view(reinterpret_cast<const char*>(labels.data()), labels.size()), meta);
        secs = Since(t0);
        c.Say(fmt::format("features {}/{}: computed {} x {} in {} part{} on {} rank{} in {:.1f} s ({:.2f} ms/image) -> {}",
                          bb.name, split, src.count(), dim, idx.parts, idx.parts > 1 ? "s" : "", size, size > 1 ? "s" : "",
                          secs, 1e3 * secs / static_cast<double>(std::max<int64_t>(1, src.count())), key));
        entry["per_rank"] = nlohmann::json::array();
        for (const auto& s : stats) entry["per_rank"].push_back(nlohmann::json::parse(s));
      }
      entry["seconds"] = secs;
      entry["ranks"] = size;
      entry["parts"] = idx.parts;
      if (c.root() && bb.prepared()) entry["fpga"] = PrepareFpgaTimes(c, bb, src, ds, stats);
      summary["computed"].push_back(entry);
    }
  }
  summary["fpga"] = c.FpgaReport();
  if (c.root())
    c.store->Put(workflow::PreparedObject(c.task.run, c.task.round), summary.dump(), {{"kind", "prepare-summary"}});
  c.comm->Barrier();  // no rank reports success before the features are committed
}

}  // namespace msaflow::modules
