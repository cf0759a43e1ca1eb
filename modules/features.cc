#include "modules/features.h"

#include <fmt/core.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "common/error.h"
#include "kernels/dataset.h"
#include "kernels/half.h"
#include "workflow/objects.h"

namespace msaflow::modules {
namespace {

[[noreturn]] void Malformed(const std::string& object, const std::string& what) {
  Throw(ErrorKind::kCorrupt, "NAM object '" + object + "': " + what);
}

FeaturesIndex IndexFromMeta(const std::string& object, const nlohmann::json& m) {
  for (const char* k : {"rows", "dim", "classes", "part_rows", "parts"})
    if (!m.contains(k) || !m[k].is_number_integer() || m[k].get<int64_t>() < 0)
      Malformed(object, std::string("features metadata lacks a non-negative integer '") + k + "'");
  FeaturesIndex f;
  f.object = object;
  f.n = m["rows"];
  f.dim = m["dim"];
  f.classes = m["classes"];
  f.part_rows = m["part_rows"];
  f.parts = m["parts"];
  if (m.contains("dtype")) {
    if (m["dtype"] != "f16" && m["dtype"] != "f32")
      Malformed(object, "features metadata: dtype " + m["dtype"].dump() + ", expected \"f32\" or \"f16\"");
    f.half = m["dtype"] == "f16";
  }
  if (m.contains("class_names")) {
    const nlohmann::json& names = m["class_names"];
    if (!names.is_array() || static_cast<int64_t>(names.size()) > f.classes)
      Malformed(object, "features metadata: class_names is not a list of at most " + std::to_string(f.classes) + " names");
    for (const auto& name : names) {
      if (!name.is_string()) Malformed(object, "features metadata: a class name is not a string");
      f.class_names.push_back(name);
    }
  }
  if (f.part_rows < 1 || f.parts != (f.n + f.part_rows - 1) / f.part_rows)
    Malformed(object, "features metadata: " + std::to_string(f.parts) + " parts of " + std::to_string(f.part_rows) +
                          " rows do not hold " + std::to_string(f.n) + " rows");
  return f;
}

}  // namespace

nlohmann::json FeaturesMeta(int64_t n, int64_t dim, int64_t classes, int64_t part_rows, bool half) {
  nlohmann::json m = {{"rows", n}, {"dim", dim}, {"classes", classes}, {"part_rows", part_rows},
                      {"parts", (n + part_rows - 1) / part_rows}};
  if (half) m["dtype"] = "f16";  // absent: float32, as features were before there was a choice
  return m;
}

double HeadMacsPerRow(const kernels::HeadConfig& h, int64_t dim, int64_t classes) {
  const double d = static_cast<double>(dim), k = static_cast<double>(classes);
  return h.type == "mlp" ? d * static_cast<double>(h.hidden) + static_cast<double>(h.hidden) * k : d * k;
}

std::string BackboneDigest(nam::Store& store, const workflow::BackboneSpec& bb) {
  auto info = store.Stat(workflow::BackboneObject(bb.name));
  if (!info) Throw(ErrorKind::kNotFound, "NAM: backbone '" + bb.name + "' is not loaded (run the load step first)");
  if (!info->meta.contains("digest") || !info->meta["digest"].is_string())
    Throw(ErrorKind::kCorrupt, "NAM object '" + info->name + "': metadata lacks the backbone digest");
  return info->meta["digest"];
}

std::string FeaturesKey(StepContext& c, const std::string& backbone, const std::string& split) {
  return workflow::FeaturesObject(BackboneDigest(*c.store, c.pipeline().Backbone(backbone)), c.DatasetDigest(split));
}

FeaturesIndex FeaturesShape(StepContext& c, const std::string& backbone, const std::string& split) {
  std::string key = FeaturesKey(c, backbone, split);
  auto info = c.store->Stat(key);
  if (!info) Throw(ErrorKind::kNotFound, "NAM: no object '" + key + "' (run the prepare step first)");
  return IndexFromMeta(key, info->meta);
}

FeaturesIndex OpenFeatures(StepContext& c, const std::string& backbone, const std::string& split) {
  return OpenFeaturesObject(*c.store, FeaturesKey(c, backbone, split));
}

FeaturesIndex OpenFeaturesObject(nam::Store& store, const std::string& key) {
  nam::Object o = store.Get(key);
  FeaturesIndex f = IndexFromMeta(key, o.info.meta);
  if (static_cast<int64_t>(o.bytes.size()) != f.n)
    Malformed(key, std::to_string(o.bytes.size()) + " label bytes for " + std::to_string(f.n) + " rows");
  f.labels.assign(o.bytes.begin(), o.bytes.end());
  for (uint8_t l : f.labels)
    if (l >= f.classes) Malformed(key, "label " + std::to_string(l) + " outside the " + std::to_string(f.classes) + " classes");
  return f;
}

void NarrowFeatures(const std::string& backbone, const float* x, size_t n, std::vector<uint16_t>& out) {
  float top = 0;
  bool bad = false;  // past the range, or not a number
  for (size_t i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    top = a > top ? a : top;
    bad |= !(a <= kernels::kHalfMax);
  }
  if (bad)
    Throw(ErrorKind::kInvalidInput, "backbone '" + backbone + "': a feature value of " +
                                        (top > kernels::kHalfMax ? fmt::format("{:g}", top) : std::string("NaN")) +
                                        " is beyond float16's range (65504): set its \"feature_dtype\" to \"f32\"");
  out.resize(n);
  kernels::FloatToHalf(x, out.data(), n);
}

void ReadFeaturesPart(nam::Store& store, const FeaturesIndex& f, int64_t p, std::string& bytes) {
  const std::string name = workflow::FeaturesPartObject(f.object, p);
  thread_local std::string halves;  // a float16 part as read, before it is widened into `bytes`
  std::string& got = f.half ? halves : bytes;
  store.GetInto(name, got);
  const auto values = static_cast<size_t>((f.PartHi(p) - f.PartLo(p)) * f.dim);
  const size_t want = values * (f.half ? sizeof(uint16_t) : sizeof(float));
  if (got.size() != want)
    Malformed(name, std::to_string(got.size()) + " bytes, expected " + std::to_string(want) + " (" +
                        std::to_string(f.PartHi(p) - f.PartLo(p)) + " rows x " + std::to_string(f.dim) +
                        (f.half ? " float16)" : " float32)"));
  if (f.half) {
    bytes.resize(values * sizeof(float));
    kernels::HalfToFloat(reinterpret_cast<const uint16_t*>(halves.data()), reinterpret_cast<float*>(bytes.data()),
                         values);
  }
}

Features LoadFeatures(StepContext& c, const std::string& backbone, const std::string& split) {
  return LoadFeaturesObject(*c.store, FeaturesKey(c, backbone, split), c.Overlapping("features " + split));
}

Features LoadFeaturesObject(nam::Store& store, const std::string& key, OverlapChoice& reading) {
  FeaturesIndex idx = OpenFeaturesObject(store, key);
  Features f;
  f.n = idx.n;
  f.dim = idx.dim;
  f.classes = idx.classes;
  f.labels = std::move(idx.labels);
  f.x.resize(static_cast<size_t>(f.n * f.dim));
  std::string buf[2];
  Overlap(
      idx.parts, [&](int64_t p) { ReadFeaturesPart(store, idx, p, buf[p % 2]); },
      [&](int64_t p) {
        std::memcpy(f.x.data() + idx.PartLo(p) * f.dim, buf[p % 2].data(), buf[p % 2].size());
      },
      reading);
  return f;
}

}  // namespace msaflow::modules
