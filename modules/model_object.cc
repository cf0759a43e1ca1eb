#include "modules/model_object.h"

#include <cstring>
#include <string>

#include "common/error.h"

namespace msaflow::modules {

kernels::Head HeadFromModel(const nam::Object& m, const kernels::HeadConfig& cfg) {
  const nlohmann::json& meta = m.info.meta;
  const std::string where = "NAM object '" + m.info.name + "'";
  if (!meta.is_object() || !meta.contains("in_dim") || !meta["in_dim"].is_number_integer() ||
      !meta.contains("classes") || !meta["classes"].is_number_integer())
    Throw(ErrorKind::kCorrupt, where + ": model metadata lacks in_dim/classes (integers)");
  const std::string layout = meta.contains("weights_layout") && meta["weights_layout"].is_string()
                                 ? meta["weights_layout"].get<std::string>()
                                 : "msaflow.head/1";
  if (layout != kernels::kWeightsLayout)
    Throw(ErrorKind::kInvalidInput, where + ": weights layout " + layout + ", this msaflow reads " +
                                        kernels::kWeightsLayout + " (a model from an older version: train it again)");
  size_t head_bytes = m.bytes.size();
  if (meta.contains("tail")) {
    const nlohmann::json& t = meta["tail"];
    if (!t.is_object() || !t.contains("head_bytes") || !t["head_bytes"].is_number_unsigned() ||
        t["head_bytes"].get<size_t>() > m.bytes.size())
      Throw(ErrorKind::kCorrupt, where + ": model metadata: tail.head_bytes is not a size within the object");
    head_bytes = t["head_bytes"].get<size_t>();
  }
  try {
    return kernels::Head::Deserialize(cfg, meta["in_dim"].get<int64_t>(), meta["classes"].get<int64_t>(),
                                      head_bytes == m.bytes.size() ? m.bytes : m.bytes.substr(0, head_bytes));
  } catch (const Error& e) {
    Throw(e.kind(), where + ": " + e.what());
  }
}

std::string ModelBytes(const kernels::Head& h, const kernels::Tail* tail, const std::string& train_from,
                       nlohmann::json* meta) {
  std::string bytes = h.Serialize();
  if (!tail) return bytes;
  nlohmann::json params = nlohmann::json::array();
  const size_t head_bytes = bytes.size();
  for (const kernels::TailParam& p : tail->params()) {
    params.push_back({{"name", p.name}, {"dims", p.dims}});
    bytes.append(reinterpret_cast<const char*>(p.value.data()), p.value.size() * sizeof(float));
  }
  (*meta)["tail"] = {{"train_from", train_from}, {"head_bytes", head_bytes}, {"params", params}};
  return bytes;
}

TailWeights TailOfModel(const nam::Object& m) {
  TailWeights w;
  const nlohmann::json& meta = m.info.meta;
  if (!meta.is_object() || !meta.contains("tail")) return w;
  const std::string where = "NAM object '" + m.info.name + "'";
  size_t at = 0;
  try {
    const nlohmann::json& t = meta.at("tail");
    w.train_from = t.at("train_from").get<std::string>();
    at = t.at("head_bytes").get<size_t>();
    for (const auto& p : t.at("params")) {
      w.names.push_back(p.at("name").get<std::string>());
      w.dims.push_back(p.at("dims").get<kernels::TensorDims>());
    }
  } catch (const nlohmann::json::exception& e) {
    Throw(ErrorKind::kCorrupt, where + ": model metadata: tail: " + e.what());
  }
  for (const auto& d : w.dims) {
    const int64_t n = kernels::NumElements(d);
    const size_t bytes = static_cast<size_t>(n) * sizeof(float);
    if (n < 0 || at + bytes > m.bytes.size())
      Throw(ErrorKind::kCorrupt,
            where + ": the tail's weights run past the object's " + std::to_string(m.bytes.size()) + " bytes");
    w.values.emplace_back(static_cast<size_t>(n));
    std::memcpy(w.values.back().data(), m.bytes.data() + at, bytes);
    at += bytes;
  }
  if (at != m.bytes.size())
    Throw(ErrorKind::kCorrupt, where + ": " + std::to_string(m.bytes.size() - at) + " bytes after the tail's weights");
  return w;
}

void ApplyTail(const TailWeights& w, kernels::Tail* tail, const std::string& where) {
  auto& params = tail->params();
  if (params.size() != w.names.size())
    Throw(ErrorKind::kCorrupt, where + ": " + std::to_string(w.names.size()) +
                                   " tail weights, the backbone's tail from '" + w.train_from + "' has " +
                                   std::to_string(params.size()));
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].name != w.names[i] || params[i].dims != w.dims[i])
      Throw(ErrorKind::kCorrupt, where + ": tail weight " + std::to_string(i) + " is '" + w.names[i] +
                                     "', the backbone's tail has '" + params[i].name + "' of another shape there");
    params[i].value = w.values[i];
  }
}

}  // namespace msaflow::modules
