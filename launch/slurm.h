// The Slurm launcher: each round becomes one heterogeneous job with one component per module
// the round uses (docs/slurm.md), each step an `srun --het-group=K msaflow module ...`; or, as
// a fallback, a chain of one job per step linked by --dependency=afterok.
// Slurm's commands go through JobRunner (launch/job_runner.h). This header holds what the
// launcher is made of (the batch scripts, scontrol's states read); the launcher itself is
// launch/slurm_launcher.h.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "launch/job_runner.h"
#include "launch/launcher.h"
#include "workflow/machine.h"

namespace msaflow::launch {

// One component (or a plain job) as scontrol reports it.
struct JobState {
  std::string id;         // "12+1" for component 1 of hetjob 12, else "12"
  std::string job_id;     // Slurm's own id of this component
  int offset = -1;        // HetJobOffset, -1 for a plain job
  std::string state;      // JobState: PENDING, RUNNING, COMPLETED, FAILED, TIMEOUT, ...
  std::string reason;
  int exit_code = 0, signal = 0;
  std::string partition, nodes;
};

// Parses `scontrol show job -o` output. Lines it cannot read are skipped.
std::vector<JobState> ParseShowJob(const std::string& text);
bool IsTerminal(const std::string& state);
// From a step's log: srun's "Task launch for StepId=... failed on node N: WHY" (its node's
// slurmd gone, say), as "srun could not start it on node N: WHY"; "" when there is none.
std::string LaunchFailure(const std::string& log_text);
// From a step's log: its first "msaflow: error: ..." (or internal error) line, which says more
// than srun's closing words (the local launcher's "last output"); "" when there is none.
std::string FirstError(const std::string& log_text);
// From `scontrol show node -o` output: the nodes Slurm holds down or not responding, each as
// "dam02 (DOWN+NOT_RESPONDING: Not responding)", in the order given.
std::vector<std::string> LostNodes(const std::string& show_node);
// LostNodes of the nodes a job's components ran on, as Slurm now holds them.
std::vector<std::string> LostNodesOf(JobRunner& jobs, const std::vector<JobState>& components);
// A job is done when every component is terminal; its end state is the first component that
// did not complete (or COMPLETED).
std::string EndState(const std::vector<JobState>& components);

// The modules a set of tasks uses, in order of first use, with the ranks each needs: the
// components of a round's hetjob.
std::vector<std::pair<std::string, int64_t>> Components(const std::vector<Task>& tasks);

struct SlurmScriptParams {
  std::string run, run_dir, log_dir, progress, exe;
  int round = 0;
};

// The batch script of a round as one hetjob: components in order of first use, one
// `step` line per task. `tasks` may be a subset of the plan (a retry skips finished ones).
std::string HetjobScript(const std::vector<Task>& tasks, const Machine& m,
                         const std::map<std::string, std::string>& task_files, const SlurmScriptParams& p);
// The batch script of a round as one allocation over `slurm.partition` (single mode): the
// modules' node sets are taken from it by node feature (or in order), each step an
// `srun --nodes --nodelist` on its module's nodes.
std::string SingleScript(const std::vector<Task>& tasks, const Machine& m,
                         const std::map<std::string, std::string>& task_files, const SlurmScriptParams& p);
// The batch script of one task as its own job (chained mode).
std::string ChainedScript(const Task& t, const Machine& m, const std::map<std::string, std::string>& task_files,
                          const SlurmScriptParams& p);

std::string ShellQuote(const std::string& s);

}  // namespace msaflow::launch
