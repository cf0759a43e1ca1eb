#include "modules/model_object.h"

#include <string>

#include "common/error.h"

namespace msaflow::modules {

kernels::Head HeadFromModel(const nam::Object& m, const kernels::HeadConfig& cfg) {
  const nlohmann::json& meta = m.info.meta;
  const std::string where = "NAM object '" + m.info.name + "'";
  if (!meta.is_object() || !meta.contains("in_dim") || !meta["in_dim"].is_number_integer() ||
      !meta.contains("classes") || !meta["classes"].is_number_integer())
    Throw(ErrorKind::kCorrupt, where + ": model metadata lacks in_dim/classes (integers)");
  const std::string layout =
      meta.contains("weights_layout") && meta["weights_layout"].is_string() ? meta["weights_layout"].get<std::string>()
                                                                            : "msaflow.head/1";
  if (layout != kernels::kWeightsLayout)
    Throw(ErrorKind::kInvalidInput, where + ": weights layout " + layout + ", this msaflow reads " +
                                        kernels::kWeightsLayout + " (a model from an older version: train it again)");
  try {
    return kernels::Head::Deserialize(cfg, meta["in_dim"].get<int64_t>(), meta["classes"].get<int64_t>(), m.bytes);
  } catch (const Error& e) {
    Throw(e.kind(), where + ": " + e.what());
  }
}

}  // namespace msaflow::modules
