// `msaflow status RUN`: a run directory's story from its journal (rounds, tasks, Slurm jobs,
// the NAM server), and its state as it is now, not as the journal last left it: a journal
// without an end is "running" only while the coordinator holds the run's lock.
#pragma once

#include <cstdio>
#include <string>

namespace msaflow::orchestrator {

enum class RunState { kRunning, kInterrupted, kFailed, kFinished };

// Prints the run's state and returns it. Throws kNotFound / kCorrupt.
RunState PrintStatus(const std::string& run_dir, std::FILE* out);

}  // namespace msaflow::orchestrator
