// One coordinator per run: the coordinator holds a POSIX write lock on runs/<id>/coordinator.lock
// for as long as it lives (the kernel drops it when the process dies, however it dies), so
// `status` can tell a running run from an interrupted one, and `resume` refuses a run whose
// coordinator is still alive. POSIX locks are not inherited by children, so a step process
// that outlives its coordinator does not keep the run "running".
#pragma once

#include <sys/types.h>

#include <string>

namespace msaflow::record {

class CoordinatorLock {
 public:
  // Takes the lock of `run_dir`. Throws kInvalidInput "run <dir> is still running
  // (coordinator pid N)" when another process holds it.
  explicit CoordinatorLock(const std::string& run_dir);
  ~CoordinatorLock();
  CoordinatorLock(const CoordinatorLock&) = delete;
  CoordinatorLock& operator=(const CoordinatorLock&) = delete;

 private:
  int fd_ = -1;
};

// The pid of the process holding `run_dir`'s lock (as the kernel reports it; 0 when none
// does or the run directory has no lock file). Takes no lock itself.
pid_t CoordinatorHolding(const std::string& run_dir);

}  // namespace msaflow::record
