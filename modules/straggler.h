// The straggler experiment knob (docs/parallel.md): the pipeline's steps.train.straggler, or
// MSAFLOW_STRAGGLER=RANK:FACTOR[:STEP] (STEP train by default), which wins. Internal to modules/.
#pragma once

#include <string>

#include "parallel/train.h"
#include "workflow/kinds.h"

namespace msaflow::modules {

// The straggler for `step`, given the pipeline's (rank -1: none). Throws kInvalidInput for a
// malformed MSAFLOW_STRAGGLER.
parallel::Straggler StragglerFor(workflow::Step step, const parallel::Straggler& from_pipeline);

}  // namespace msaflow::modules
