// What every step gets: its task, the NAM, its ranks and where its output goes (internal to
// modules/).
#pragma once

#include <cstdio>
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

  const workflow::Pipeline& pipeline() const { return task.pipeline; }
  bool root() const { return comm->rank() == 0; }
  // One line of progress, "[rank] " first when the step has several ranks.
  void Say(const std::string& line) const;
};

void Load(StepContext& c);
void Prepare(StepContext& c);
void Train(StepContext& c);
void Store(StepContext& c);
void Evaluate(StepContext& c);
void Select(StepContext& c);

}  // namespace msaflow::modules
