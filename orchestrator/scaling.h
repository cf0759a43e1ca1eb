// `msaflow scaling`: strong or weak scaling of a pipeline's steps, measured by running round 1
// at each rank count (and each training mode asked for) with one thread per rank, so that the
// figures mean the same on any machine. Writes scaling.json and scaling.md (docs/parallel.md).
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include <functional>
#include <memory>

#include "orchestrator/run_observer.h"
#include "workflow/machine.h"
#include "workflow/pipeline.h"

namespace msaflow::orchestrator {

struct ScalingOptions {
  std::vector<int64_t> ranks = {1, 2};
  bool weak = false;  // weak: the datasets' limits grow with the ranks
  std::vector<workflow::Step> steps = workflow::DivisibleSteps();
  std::vector<std::string> modes;  // train modes; empty: the pipeline's
  std::string runs_dir = "runs";
  std::string msaflow_exe;
  std::string id;  // "" = scaling-<name>-<time>-<random>
  // What watches each run, given the run's log file (the CLI: its progress printer, no bar).
  // Empty: nobody.
  std::function<std::unique_ptr<RunObserver>(std::FILE* log)> observe;
};

// Runs every configuration, prints the table to `out` and returns the directory holding
// scaling.json, scaling.md and the runs. Throws kInvalidInput for options that cannot run.
std::string RunScaling(const workflow::Pipeline& p, const Machine& m, const ScalingOptions& opt, std::FILE* out);

}  // namespace msaflow::orchestrator
