#include "modules/finetune_maps.h"

#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "common/clock.h"
#include "common/error.h"
#include "kernels/executor.h"
#include "kernels/fpga/device.h"
#include "kernels/onnx_graph.h"
#include "modules/features.h"
#include "workflow/backbones.h"
#include "workflow/datasets.h"
#include "workflow/objects.h"

namespace msaflow::modules {
namespace {

constexpr int64_t kMapBatch = 64;

// The backbone as the load step stored it: its model cut at feature_layer.
kernels::Graph BackboneGraph(StepContext& c, const workflow::BackboneSpec& bb, std::string* bytes) {
  nam::Object o = c.store->Get(workflow::BackboneObject(bb.name));
  *bytes = std::move(o.bytes);
  return kernels::ImportOnnx(*bytes, "NAM " + o.info.name, bb.feature_layer);
}

// The maps' layout, as a maps object's metadata gives it.
struct MapsLayout {
  std::vector<std::string> inputs;
  std::vector<kernels::TensorDims> dims;
  int64_t row = 0;  // floats per row: every input's values for one image
};

MapsLayout LayoutFromMeta(const std::string& object, const nlohmann::json& meta) {
  MapsLayout l;
  try {
    for (const auto& in : meta.at("inputs")) {
      l.inputs.push_back(in.at("name").get<std::string>());
      l.dims.push_back(in.at("dims").get<kernels::TensorDims>());
      if (l.dims.back().size() != 3) Throw(ErrorKind::kCorrupt, "an input's dims are not (C, H, W)");
      l.row += kernels::NumElements(l.dims.back());
    }
  } catch (const nlohmann::json::exception& e) {
    Throw(ErrorKind::kCorrupt, "NAM object '" + object + "': maps metadata: " + e.what());
  }
  if (l.inputs.empty() || l.row != meta.value("dim", int64_t{-1}))
    Throw(ErrorKind::kCorrupt, "NAM object '" + object + "': maps metadata: the inputs' sizes do not add up to dim");
  return l;
}

// This rank's parts [p0, p1) of the maps of `src`, computed by `trunk` and put in the NAM.
void ComputeMapsParts(StepContext& c, const workflow::BackboneSpec& bb, kernels::Executor& trunk,
                      const workflow::SplitSource& src, const FeaturesIndex& idx, int64_t p0, int64_t p1) {
  if (p0 >= p1) return;
  const int64_t lo = idx.PartLo(p0), hi = idx.PartHi(p1 - 1);
  const kernels::ImageSet ds = src.Read(lo, hi);
  const auto& in = bb.input;
  kernels::fpga::Device& fpga = c.Fpga();
  const int64_t per = in.channels * in.height * in.width;
  std::vector<float> batch(static_cast<size_t>(kMapBatch * per));
  std::vector<float> part;
  std::vector<uint16_t> halves;  // a part narrowed to float16 (MapsInHalf)
  int64_t p = p0;
  for (int64_t s = 0; s < hi - lo; s += kMapBatch) {
    const int64_t b = std::min(kMapBatch, hi - lo - s);
    kernels::fpga::PrepareImages(fpga, ds, 0, s, b, in, batch.data());
    std::vector<std::vector<int64_t>> dims;
    const std::vector<std::vector<float>> m = trunk.Maps(batch.data(), b, in.channels, in.height, in.width, &dims);
    for (int64_t k = 0; k < b; ++k) {
      for (size_t i = 0; i < m.size(); ++i) {
        const int64_t size = kernels::NumElements(dims[i]) / b;
        part.insert(part.end(), m[i].begin() + k * size, m[i].begin() + (k + 1) * size);
      }
      const int64_t row = lo + s + k + 1;  // rows below this one are done
      if (row == idx.PartHi(p)) {
        std::string_view data(reinterpret_cast<const char*>(part.data()), part.size() * sizeof(float));
        if (idx.half) {
          NarrowFeatures(bb.name, part.data(), part.size(), halves);
          data = std::string_view(reinterpret_cast<const char*>(halves.data()), halves.size() * sizeof(uint16_t));
        }
        c.store->Put(workflow::FeaturesPartObject(idx.object, p), data, {{"kind", "maps-part"}});
        part.clear();
        ++p;
      }
    }
  }
}

// One backbone's maps of one split, computed into the NAM object `key` (each rank its parts).
nlohmann::json ComputeMaps(StepContext& c, const workflow::BackboneSpec& bb, const workflow::SplitSource& src,
                           const std::string& key, const kernels::Tail& tail, kernels::Executor& trunk,
                           int64_t classes) {
  const auto t0 = SteadyClock::now();
  nlohmann::json entry = {{"backbone", bb.name}, {"split", src.name()}, {"object", key}};
  const auto& in = bb.input;
  std::vector<float> one(static_cast<size_t>(in.channels * in.height * in.width), 0.f);
  std::vector<std::vector<int64_t>> dims;
  trunk.Maps(one.data(), 1, in.channels, in.height, in.width, &dims);
  nlohmann::json inputs = nlohmann::json::array();
  int64_t row = 0;
  for (size_t i = 0; i < dims.size(); ++i) {
    const kernels::TensorDims d(dims[i].begin() + 1, dims[i].end());
    inputs.push_back({{"name", tail.inputs()[i]}, {"dims", d}});
    row += kernels::NumElements(d);
  }
  FeaturesIndex idx;
  idx.object = key;
  idx.n = src.count();
  idx.dim = row;
  idx.part_rows = FeaturesPartRows(row, kMapBatch, FeaturesPartBytes());
  idx.parts = (idx.n + idx.part_rows - 1) / idx.part_rows;
  idx.half = workflow::MapsInHalf(bb, src.name());
  const int rank = c.comm->rank(), size = c.comm->size();
  ComputeMapsParts(c, bb, trunk, src, idx, idx.parts * rank / size, idx.parts * (rank + 1) / size);
  c.comm->Barrier();  // every rank's parts are in before the object that says they are
  const double bytes = PutMapsObject(c, bb, src, idx, classes, inputs, fmt::format(" in {:.1f} s", SecondsSince(t0)));
  entry.update({{"computed", true}, {"rows", idx.n}, {"bytes", bytes}, {"seconds", SecondsSince(t0)}, {"ranks", size}});
  return entry;
}

}  // namespace

double PutMapsObject(StepContext& c, const workflow::BackboneSpec& bb, const workflow::SplitSource& src,
                     const FeaturesIndex& idx, int64_t classes, const nlohmann::json& inputs, const std::string& how) {
  const double bytes = static_cast<double>(idx.n * idx.dim * (idx.half ? 2 : 4));  // float16 or float32 values
  if (!c.root()) return bytes;
  nlohmann::json meta = FeaturesMeta(idx.n, idx.dim, classes, idx.part_rows, idx.half);
  meta.update(
      {{"kind", "maps"}, {"inputs", inputs}, {"backbone", bb.name}, {"train_from", bb.train_from}, {"split", src.name()}});
  if (!src.class_names().empty()) meta["class_names"] = src.class_names();
  const auto& labels = src.labels();
  c.store->Put(idx.object, std::string_view(reinterpret_cast<const char*>(labels.data()), labels.size()), meta);
  const int size = c.comm->size();
  c.Say(fmt::format("maps {}/{} at {}: {} images x {} values ({:.1f} MB) in {} part{} on {} rank{}{} -> {}", bb.name,
                    src.name(), bb.train_from, idx.n, idx.dim, bytes / 1e6, idx.parts, idx.parts == 1 ? "" : "s", size,
                    size == 1 ? "" : "s", how, idx.object));
  return bytes;
}

parallel::FinetuneData Maps::Data() const {
  parallel::FinetuneData d;
  for (const auto& v : values) d.maps.push_back(v.data());
  d.dims = dims;
  d.y = labels.data();
  d.n = n;
  return d;
}

std::string MapsKey(StepContext& c, const workflow::BackboneSpec& bb, const std::string& split) {
  return workflow::MapsObject(BackboneDigest(*c.store, bb), c.DatasetDigest(split), bb.train_from);
}

std::unique_ptr<kernels::Tail> BackboneTails::Make(const workflow::BackboneSpec& bb) {
  auto it = graphs_.find(bb.name);
  if (it == graphs_.end()) {
    std::string bytes;
    it = graphs_.emplace(bb.name, BackboneGraph(c_, bb, &bytes)).first;
  }
  try {
    return std::make_unique<kernels::Tail>(it->second, bb.train_from);
  } catch (const Error& e) {
    Throw(e.kind(), "backbone '" + bb.name + "': " + e.what());
  }
}

nlohmann::json PrepareMaps(StepContext& c) {
  nlohmann::json entries = nlohmann::json::array();
  const workflow::Pipeline& p = c.pipeline();
  std::vector<workflow::SplitSource> splits;  // opened on first need
  int64_t classes = 0;
  for (const auto& bb : p.backbones) {
    if (!p.FinetunesIn(bb, c.task.round)) continue;
    std::unique_ptr<kernels::Tail> tail;       // the model imported, and the datasets read, only
    std::unique_ptr<kernels::Executor> trunk;  // where some split's maps are not in the NAM yet
    for (const std::string& split : workflow::SplitNames(p, c.task.test)) {
      const std::string key = MapsKey(c, bb, split);
      int have = c.root() && c.store->Stat(key) ? 1 : 0;  // rank 0 decides for all
      c.comm->Bcast(&have, sizeof have, 0);
      if (have) {
        entries.push_back({{"backbone", bb.name}, {"split", split}, {"object", key}, {"computed", false}});
        continue;
      }
      c.WorkAhead();  // not in the coordinator: a backbone's trunk over every image
      if (splits.empty()) {
        splits = workflow::OpenSplits(p, c.task.test);
        classes = workflow::CheckSplits(p, splits);
      }
      if (!tail) {
        std::string bytes;
        tail = std::make_unique<kernels::Tail>(BackboneGraph(c, bb, &bytes), bb.train_from);
        trunk = std::make_unique<kernels::Executor>(
            kernels::ImportOnnxCuts(bytes, "NAM backbone/" + bb.name, tail->inputs()));
      }
      const auto src = std::find_if(splits.begin(), splits.end(), [&](const auto& s) { return s.name() == split; });
      entries.push_back(ComputeMaps(c, bb, *src, key, *tail, *trunk, classes));
    }
  }
  return entries;
}

Maps LoadMaps(StepContext& c, const workflow::BackboneSpec& bb, const std::string& split) {
  const std::string key = MapsKey(c, bb, split);
  const auto info = c.store->Stat(key);
  if (!info)
    Throw(ErrorKind::kNotFound, "NAM: no maps object '" + key + "' for backbone '" + bb.name + "' on " + split +
                                    " (the prepare step of a round that fine-tunes makes it)");
  const FeaturesIndex idx = OpenFeaturesObject(*c.store, key);
  const MapsLayout layout = LayoutFromMeta(key, info->meta);
  Maps m;
  m.inputs = layout.inputs;
  m.dims = layout.dims;
  m.n = idx.n;
  m.classes = idx.classes;
  m.labels = idx.labels;
  m.class_names = idx.class_names;
  m.values.resize(m.dims.size());
  for (size_t i = 0; i < m.dims.size(); ++i)
    m.values[i].resize(static_cast<size_t>(m.n * kernels::NumElements(m.dims[i])));
  std::string bytes;
  for (int64_t p = 0; p < idx.parts; ++p) {
    ReadFeaturesPart(*c.store, idx, p, bytes);
    const auto* x = reinterpret_cast<const float*>(bytes.data());
    for (int64_t r = idx.PartLo(p); r < idx.PartHi(p); ++r)
      for (size_t i = 0; i < m.dims.size(); ++i) {
        const int64_t size = kernels::NumElements(m.dims[i]);
        std::memcpy(m.values[i].data() + r * size, x, static_cast<size_t>(size) * sizeof(float));
        x += size;
      }
  }
  return m;
}

std::vector<float> TailFeaturesOf(kernels::Tail* tail, const Maps& maps, int64_t lo, int64_t hi, int64_t batch) {
  const parallel::FinetuneData data = maps.Data();
  std::vector<float> out;
  out.reserve(static_cast<size_t>((hi - lo) * tail->FeatureDim()));
  std::vector<int64_t> rows;
  std::vector<std::vector<float>> xs;
  std::vector<kernels::TensorDims> dims;
  for (int64_t s = lo; s < hi; s += batch) {
    const int64_t b = std::min(batch, hi - s);
    rows.resize(static_cast<size_t>(b));
    for (int64_t k = 0; k < b; ++k) rows[static_cast<size_t>(k)] = s + k;
    data.Batch(rows.data(), b, &xs, &dims);
    std::vector<const float*> ptrs(xs.size());
    for (size_t i = 0; i < xs.size(); ++i) ptrs[i] = xs[i].data();
    const std::vector<float>& f = tail->Forward(ptrs, dims);
    out.insert(out.end(), f.begin(), f.end());
  }
  return out;
}

}  // namespace msaflow::modules
