// A dynamic task farm inside one launch: ranks pull the next task index as they finish, so a
// slow rank does fewer tasks instead of holding the others back (docs/parallel.md).
//   counter     a counter on rank 0 drawn with MPI one-sided atomics; every rank works
//   dispatcher  rank 0 answers each rank's request with the next index and does no task itself
// Every index in 0..n-1 is handed out exactly once.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "parallel/comm.h"
#include "workflow/kinds.h"

namespace msaflow::parallel {

class TaskFarm {
 public:
  virtual ~TaskFarm() = default;
  // The next task for this rank, or -1 when none is left (on the dispatcher: after serving).
  virtual int64_t Next() = 0;
  // Whether this rank runs tasks (the dispatcher's rank 0 does not, when there are others).
  virtual bool works() const { return true; }
};

// Collective over `comm`.
std::unique_ptr<TaskFarm> MakeTaskFarm(Comm& comm, int64_t tasks, workflow::FarmKind kind);

}  // namespace msaflow::parallel
