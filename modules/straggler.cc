#include "modules/straggler.h"

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "common/error.h"

namespace msaflow::modules {

parallel::Straggler StragglerFor(workflow::Step step, const parallel::Straggler& from_pipeline) {
  const char* e = std::getenv("MSAFLOW_STRAGGLER");
  if (!e || !*e) return step == workflow::Step::kTrain ? from_pipeline : parallel::Straggler{};
  int rank = -1, used = 0;
  double factor = 0;
  char which[16] = "train";
  int n = std::sscanf(e, "%d:%lf%n:%15[a-z]%n", &rank, &factor, &used, which, &used);
  const std::optional<workflow::Step> slowed = workflow::StepFromName(which);
  if (n < 2 || static_cast<size_t>(used) != std::string(e).size() || rank < 0 || !(factor >= 1) || !slowed)
    Throw(ErrorKind::kInvalidInput,
          std::string("MSAFLOW_STRAGGLER='") + e + "': expected RANK:FACTOR[:STEP], e.g. 1:4 or 0:10:evaluate");
  if (step != *slowed) return {};
  return {rank, factor};
}

}  // namespace msaflow::modules
