// The signals that ask a coordinator or the service to stop (SIGINT, SIGTERM): a flag their
// handlers set, the checks that throw once one arrived, and a scope that holds them back from a
// thread computing in-process. The launchers (launch/), the run driver (orchestrator/), the CLI
// and the service use them.
#pragma once

#include <signal.h>

#include <string>

namespace msaflow {

// SIGINT/SIGTERM to the coordinator: InstallInterruptHandlers makes them set a flag (no
// SA_RESTART, so waits return EINTR) that the launchers check; they then end what they started
// (child processes, Slurm jobs) and throw kTaskFailed "interrupted by signal N".
void InstallInterruptHandlers();
int InterruptSignal();  // 0 until one arrived
// Throws kTaskFailed "interrupted by signal N <during>" once one arrived: for the coordinator's
// own work between tasks (rung 0 of the halving strategy), which no launcher waits on.
void ThrowIfInterrupted(const std::string& during);

// {SIGINT, SIGTERM}: the signals that ask a coordinator or the service to stop.
sigset_t StopSignals();

// Holds SIGINT/SIGTERM back from the calling thread while the coordinator computes in-process
// (oneDNN, OpenMP): a signal delivered into oneDNN's running kernels was seen to corrupt the heap
// (glibc aborted in sgemm's free, 1 cancel in ~20 on a loaded 2-core VM; none in 135 with the
// signals held). Threads started meanwhile, OpenMP's pool among them, keep the mask and never take
// one. ThrowIfInterrupted takes a held signal (setting the flag) and throws; the destructor
// restores the mask, so one that came after the last look is delivered then.
class InterruptsHeld {
 public:
  InterruptsHeld();
  ~InterruptsHeld();
  InterruptsHeld(const InterruptsHeld&) = delete;
  InterruptsHeld& operator=(const InterruptsHeld&) = delete;
  void ThrowIfInterrupted(const std::string& during) const;

 private:
  sigset_t old_{};
};

}  // namespace msaflow
