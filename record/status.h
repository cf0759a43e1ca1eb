// `msaflow status RUN`: a run directory's story from its journal (rounds, tasks, Slurm jobs,
// the NAM server), and its state as it is now, not as the journal last left it: a journal
// without an end is "running" only while the coordinator holds the run's lock.
#pragma once

#include <sys/types.h>

#include <cstdio>
#include <string>
#include <vector>

#include "record/journal.h"

namespace msaflow::record {

enum class RunState { kRunning, kInterrupted, kFailed, kCancelled, kFinished };
// "running", "interrupted", "failed", "cancelled", "finished"
const char* StateName(RunState s);

// A run's state now: its journal's summary, and who holds its coordinator lock.
struct RunStatus {
  RunState state = RunState::kRunning;
  std::string line;  // "finished: champion ...", "running (coordinator pid N), task ...", ...
  RunSummary summary;
  pid_t holder = 0;  // the live coordinator's pid, 0 when none
};
// Throws kNotFound (no journal) / kCorrupt.
RunStatus StatusOf(const std::string& run_dir);
// The state line from a summary and the lock holder (no I/O).
RunStatus StateFrom(RunSummary summary, pid_t holder, const std::string& run_dir);

// One row of the task table: what became of each task the journal names.
struct TaskRow {
  std::string task, module, state, started;  // state: done | reused | running | failed | interrupted
  int ranks = 1, starts = 0, retries = 0;
  double seconds = -1;  // -1: not ended
};
std::vector<TaskRow> TaskRows(const RunStatus& st);

// Prints the run's story and its task table, then its state; returns the state. A directory
// holding runs (no journal of its own) gets a table of its runs instead, and kFinished.
// Throws kNotFound / kCorrupt.
RunState PrintStatus(const std::string& dir, std::FILE* out);

}  // namespace msaflow::record
