// Evaluation results as JSON (the eval-shard and result objects; internal to modules/).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kernels/metrics.h"

namespace msaflow::modules {

// The counts, accuracy, loss and confusion matrix, and per class ("per_class": index, name,
// images, correct, accuracy). `names` are the class names by index (an image folder's); when
// given they are written as "class_names", and a class without one is named by its index.
nlohmann::json MetricsJson(const kernels::Metrics& m, const std::vector<std::string>& names = {});
// The class names a result records ("class_names"; empty when it has none).
std::vector<std::string> ClassNamesOf(const nlohmann::json& result);
// Throws kCorrupt naming `where` when `j` is not a result.
kernels::Metrics MetricsFromJson(const nlohmann::json& j, const std::string& where);

}  // namespace msaflow::modules
