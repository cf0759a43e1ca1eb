// A NAM server started for a run (`msaflow nam serve` as a child process, or under Slurm an
// `srun ... msaflow nam serve` child) and stopped by its PID when the run ends, however it ends.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "common/child_process.h"
#include "common/clock.h"
#include "launch/job_runner.h"
#include "workflow/machine.h"

namespace msaflow::launch {

using workflow::NamSpec;

// How the server is started: here, or through a launcher command (srun) that places it.
struct NamLaunch {
  std::vector<std::string> prefix;  // e.g. {"srun", "--het-group=1", ...}; empty: a plain child
  bool own_allocation = false;      // the prefix makes a new Slurm job: drop SLURM_* job variables
  std::string token_file;           // --token-file for the server ("" = none)
  double start_timeout_s = 30;      // includes waiting for an allocation under Slurm
  double lock_wait_s = 0;           // --lock-wait: a resumed run's server waits for its predecessor's
  // A server other runs share (launch/shared_nam.h): not ended with this process (no
  // parent-death signal, a session of its own, not stopped by the destructor); it stops once no
  // process holds a shared lock on `users_lock`.
  bool detached = false;
  std::string users_lock;
  // Under Slurm: how its job is signalled and watched (launch/job_runner.h); null = no Slurm.
  JobRunner* jobs = nullptr;
  Clock* clock = &SystemClock();  // the start-up and stop waits
};

class NamServerProcess {
 public:
  // Starts the server and waits until it serves (its ready file appears). Throws
  // kUnavailable with the end of the server's log when it exits or does not come up in time.
  NamServerProcess(const std::string& msaflow_exe, const NamSpec& spec, const std::string& persist_dir,
                   const std::string& log_path, const std::string& ready_path, const NamLaunch& launch = {});
  ~NamServerProcess();  // SIGTERM; SIGKILL after 10 s (a detached server is left to stop by itself)
  NamServerProcess(const NamServerProcess&) = delete;
  NamServerProcess& operator=(const NamServerProcess&) = delete;

  const std::string& uri() const { return uri_; }
  // "" while the server runs; once it has exited, what happened ("killed by signal 9"), and it
  // is reaped (the run's liveness check polls this).
  std::string Exited();
  pid_t pid() const { return child_.pid(); }
  // Where Slurm placed it (empty when not under Slurm).
  const std::string& slurm_job() const { return slurm_job_; }
  const std::string& node() const { return node_; }

 private:
  ChildProcess child_;
  bool detached_ = false;
  JobRunner* jobs_ = nullptr;
  Clock* clock_ = &SystemClock();
  std::string uri_, slurm_job_, node_;
};

}  // namespace msaflow::launch
