// Evaluation results as JSON (the eval-shard and result objects; internal to modules/).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kernels/metrics.h"
#include "workflow/candidates.h"

namespace msaflow::modules {

struct StepContext;

// The counts, accuracy, loss and confusion matrix, and per class ("per_class": index, name,
// images, correct, accuracy). `names` are the class names by index (an image folder's); when
// given they are written as "class_names", and a class without one is named by its index.
nlohmann::json MetricsJson(const kernels::Metrics& m, const std::vector<std::string>& names = {});
// The class names a result records ("class_names"; empty when it has none).
std::vector<std::string> ClassNamesOf(const nlohmann::json& result);
// Throws kCorrupt naming `where` when `j` is not a result.
kernels::Metrics MetricsFromJson(const nlohmann::json& j, const std::string& where);

// The head in NAM object `model` (trained as `cand`) over the whole of `split`'s features of its
// backbone, on this rank alone: how select scores a model kept from an earlier round on the test
// split that round held back (workflow::TaskSpec::test). A few thousand rows through one head:
// no farm. The metrics' JSON (MetricsJson, with the split's class names).
nlohmann::json EvaluateWhole(StepContext& c, const workflow::Candidate& cand, const std::string& model,
                             const std::string& split);

}  // namespace msaflow::modules
