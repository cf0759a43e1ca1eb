// Slurm is reached through its command line (sbatch, scontrol, scancel, squeue) behind
// JobRunner, the stable interface across Slurm versions; every Slurm command msaflow runs goes
// through it, and the tests substitute a fake.
#pragma once

#include <string>
#include <vector>

namespace msaflow::launch {

class JobRunner {
 public:
  virtual ~JobRunner() = default;
  // `sbatch --parsable EXTRA... SCRIPT`: the (leader) job id. Throws kTaskFailed with
  // sbatch's own message when Slurm refuses the job.
  virtual std::string Submit(const std::string& script, const std::vector<std::string>& extra) = 0;
  // `scontrol show job -o ID`: one line per component; "" once Slurm has forgotten the job.
  virtual std::string Show(const std::string& job_id) = 0;
  virtual void Cancel(const std::string& job_id) = 0;
  // `scancel --signal=SIG ID`: the signal to the job's steps, not the end of the job.
  virtual void Signal(const std::string& job_id, const std::string& signal) = 0;
  // `squeue -h -j ID -o %T`: the job's state while it is in the queue (COMPLETING included),
  // "" once it has left it or squeue does not answer.
  virtual std::string QueueState(const std::string& job_id) = 0;
  // `scontrol show node -o LIST`: one line per node ("" when Slurm does not answer), for
  // naming the nodes a NODE_FAIL lost.
  virtual std::string ShowNodes(const std::string& nodelist) {
    (void)nodelist;
    return "";
  }
};

// A batch job's end state in words, for messages: "TIMEOUT: the job hit its time limit".
std::string DescribeState(const std::string& state);

// The real one. `conf` is exported as SLURM_CONF when not empty.
class SlurmCli : public JobRunner {
 public:
  explicit SlurmCli(std::string conf) : conf_(std::move(conf)) {}
  std::string Submit(const std::string& script, const std::vector<std::string>& extra) override;
  std::string Show(const std::string& job_id) override;
  void Cancel(const std::string& job_id) override;
  void Signal(const std::string& job_id, const std::string& signal) override;
  std::string QueueState(const std::string& job_id) override;
  std::string ShowNodes(const std::string& nodelist) override;

 private:
  std::string conf_;
};

}  // namespace msaflow::launch
