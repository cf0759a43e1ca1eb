// What a round under Slurm cost in node-seconds: held (the nodes its job(s) kept) against used
// (the steps' own time), per module, and whether chained jobs would have held fewer. The Slurm
// launcher reports it after each round (the run's results, "node_seconds"). Pure.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "workflow/machine.h"
#include "workflow/pipeline.h"

namespace msaflow::launch {

// Node-seconds held and used per module in a round under Slurm. hetjob/single hold every
// module of the round for the whole round; chained jobs hold a module only while its step
// runs. `chained_s` is what chained jobs would have held (the steps' own node-seconds).
struct NodeSeconds {
  std::string module;
  int64_t nodes = 1;
  double held_s = 0, used_s = 0;
};
std::vector<NodeSeconds> MeasureNodeSeconds(const std::map<std::string, double>& step_seconds,
                                            const workflow::Pipeline& p, const workflow::Machine& m,
                                            workflow::SlurmMode mode, double round_s);
// One line: held vs used, and whether chained jobs would hold fewer node-seconds (they pay a
// queue wait per step instead, `job_start_s` each, measured or assumed).
std::string NodeSecondsSummary(const std::vector<NodeSeconds>& ns, workflow::SlurmMode mode, size_t steps,
                               double job_start_s);

}  // namespace msaflow::launch
