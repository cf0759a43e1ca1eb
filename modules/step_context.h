// What every step gets: its task, the NAM, its ranks and where its output goes (internal to
// modules/).
#pragma once

#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include "nam/store.h"
#include "parallel/comm.h"
#include "workflow/task.h"

namespace msaflow::modules {

struct StepContext {
  workflow::TaskSpec task;
  std::unique_ptr<nam::Store> store;
  parallel::Comm* comm = nullptr;
  std::FILE* out = nullptr;
  bool overlap = true;  // fetch the next chunk while computing on this one (MSAFLOW_OVERLAP)

  const workflow::Pipeline& pipeline() const { return task.pipeline; }
  bool root() const { return comm->rank() == 0; }
  // One line of progress, "[rank] " first when the step has several ranks.
  void Say(const std::string& line) const;
  // The digest of a dataset split (train | test) as the features keys use it; the images are
  // read once per step, not once per backbone.
  const std::string& DatasetDigest(const std::string& split);

 private:
  std::map<std::string, std::string> digests_;
};

void Load(StepContext& c);
void Prepare(StepContext& c);
void Train(StepContext& c);
void Store(StepContext& c);
void Evaluate(StepContext& c);
void Select(StepContext& c);

}  // namespace msaflow::modules
