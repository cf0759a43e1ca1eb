#include "modules/features.h"

#include <cstring>

#include "common/error.h"
#include "kernels/dataset.h"
#include "workflow/objects.h"

namespace msaflow::modules {

std::string EncodeFeatures(const std::vector<uint8_t>& labels, const std::vector<float>& x) {
  std::string b(reinterpret_cast<const char*>(labels.data()), labels.size());
  b.resize((b.size() + 3) / 4 * 4, '\0');
  b.append(reinterpret_cast<const char*>(x.data()), x.size() * sizeof(float));
  return b;
}

Features DecodeFeatures(const nam::Object& o) {
  Features f;
  const auto& m = o.info.meta;
  for (const char* k : {"rows", "dim", "classes"})
    if (!m.contains(k) || !m[k].is_number_integer() || m[k].get<int64_t>() < 0)
      Throw(ErrorKind::kCorrupt, "NAM object '" + o.info.name + "': features metadata lacks rows/dim/classes");
  f.n = m["rows"];
  f.dim = m["dim"];
  f.classes = m["classes"];
  size_t lab = static_cast<size_t>((f.n + 3) / 4 * 4);
  if (o.bytes.size() != lab + static_cast<size_t>(f.n * f.dim) * sizeof(float))
    Throw(ErrorKind::kCorrupt, "NAM object '" + o.info.name + "': size does not match rows x dim");
  f.labels.assign(o.bytes.begin(), o.bytes.begin() + f.n);
  f.x.resize(static_cast<size_t>(f.n * f.dim));
  std::memcpy(f.x.data(), o.bytes.data() + lab, f.x.size() * sizeof(float));
  return f;
}

std::string BackboneDigest(nam::Store& store, const workflow::BackboneSpec& bb) {
  auto info = store.Stat(workflow::BackboneObject(bb.name));
  if (!info) Throw(ErrorKind::kNotFound, "NAM: backbone '" + bb.name + "' is not loaded (run the load step first)");
  if (!info->meta.contains("digest") || !info->meta["digest"].is_string())
    Throw(ErrorKind::kCorrupt, "NAM object '" + info->name + "': metadata lacks the backbone digest");
  return info->meta["digest"];
}

const workflow::SplitSpec& Split(const workflow::Pipeline& p, const std::string& s) {
  return s == "train" ? p.train : p.test;
}

Features FeaturesShape(StepContext& c, const std::string& backbone, const std::string& split) {
  std::string key = workflow::FeaturesObject(BackboneDigest(*c.store, c.pipeline().Backbone(backbone)),
                                             c.DatasetDigest(split));
  auto info = c.store->Stat(key);
  if (!info) Throw(ErrorKind::kNotFound, "NAM: no object '" + key + "' (run the prepare step first)");
  Features f;
  const auto& m = info->meta;
  for (const char* k : {"rows", "dim", "classes"})
    if (!m.contains(k) || !m[k].is_number_integer() || m[k].get<int64_t>() < 0)
      Throw(ErrorKind::kCorrupt, "NAM object '" + key + "': features metadata lacks rows/dim/classes");
  f.n = m["rows"];
  f.dim = m["dim"];
  f.classes = m["classes"];
  return f;
}

Features LoadFeatures(StepContext& c, const std::string& backbone, const std::string& split) {
  const auto& bb = c.pipeline().Backbone(backbone);
  return DecodeFeatures(
      c.store->Get(workflow::FeaturesObject(BackboneDigest(*c.store, bb), c.DatasetDigest(split))));
}

}  // namespace msaflow::modules
