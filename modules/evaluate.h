// Evaluation results as JSON (the eval-shard and result objects; internal to modules/).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "kernels/metrics.h"

namespace msaflow::modules {

nlohmann::json MetricsJson(const kernels::Metrics& m);
// Throws kCorrupt naming `where` when `j` is not a result.
kernels::Metrics MetricsFromJson(const nlohmann::json& j, const std::string& where);

}  // namespace msaflow::modules
