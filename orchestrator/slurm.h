// The Slurm launcher: each round becomes one heterogeneous job with one component per module
// the round uses (docs/slurm.md), each step an `srun --het-group=K msaflow module ...`; or, as
// a fallback, a chain of one job per step linked by --dependency=afterok.
//
// Slurm is reached through its command line (sbatch, scontrol, scancel) behind JobRunner, the
// stable interface across Slurm versions; the tests substitute a fake.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "orchestrator/launcher.h"
#include "orchestrator/machine.h"

namespace msaflow::orchestrator {

class JobRunner {
 public:
  virtual ~JobRunner() = default;
  // `sbatch --parsable EXTRA... SCRIPT`: the (leader) job id. Throws kTaskFailed with
  // sbatch's own message when Slurm refuses the job.
  virtual std::string Submit(const std::string& script, const std::vector<std::string>& extra) = 0;
  // `scontrol show job -o ID`: one line per component; "" once Slurm has forgotten the job.
  virtual std::string Show(const std::string& job_id) = 0;
  virtual void Cancel(const std::string& job_id) = 0;
};

// The real one. `conf` is exported as SLURM_CONF when not empty.
class SlurmCli : public JobRunner {
 public:
  explicit SlurmCli(std::string conf) : conf_(std::move(conf)) {}
  std::string Submit(const std::string& script, const std::vector<std::string>& extra) override;
  std::string Show(const std::string& job_id) override;
  void Cancel(const std::string& job_id) override;

 private:
  std::string conf_;
};

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
// A job is done when every component is terminal; its end state is the first component that
// did not complete (or COMPLETED).
std::string EndState(const std::vector<JobState>& components);
// "TIMEOUT: the job hit its time limit" and similar, for messages.
std::string DescribeState(const std::string& state);

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

class SlurmLauncher : public Launcher {
 public:
  // `retries`: how often a round whose job ends in one of `retry_on` is resubmitted (its
  // unfinished steps only).
  SlurmLauncher(Machine m, std::string exe, std::string run, std::string run_dir, std::unique_ptr<JobRunner> runner,
                int retries, std::vector<std::string> retry_on);
  void RunRound(const RoundPlan& plan, const std::map<std::string, std::string>& task_files, const std::string& log_dir,
                const LaunchObserver& obs) override;

 private:
  Machine m_;
  std::string exe_, run_, run_dir_;
  std::unique_ptr<JobRunner> runner_;
  int retries_;
  std::vector<std::string> retry_on_;
  std::vector<std::string> modes_;  // slurm.mode, then its fallbacks
  size_t mode_i_ = 0;               // the mode in use; moves on when Slurm refuses one
};

std::string ShellQuote(const std::string& s);

}  // namespace msaflow::orchestrator
