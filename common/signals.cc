#include "common/signals.h"

#include <pthread.h>
#include <signal.h>
#include <time.h>

#include "common/error.h"

namespace msaflow {
namespace {

volatile sig_atomic_t g_interrupt = 0;

void OnInterrupt(int sig) { g_interrupt = sig; }

}  // namespace

void InstallInterruptHandlers() {
  struct sigaction sa {};
  sa.sa_handler = OnInterrupt;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
}

int InterruptSignal() { return g_interrupt; }

void ThrowIfInterrupted(const std::string& during) {
  if (const int sig = InterruptSignal())
    Throw(ErrorKind::kTaskFailed, "interrupted by signal " + std::to_string(sig) + " " + during);
}

sigset_t StopSignals() {
  sigset_t s;
  sigemptyset(&s);
  sigaddset(&s, SIGINT);
  sigaddset(&s, SIGTERM);
  return s;
}

InterruptsHeld::InterruptsHeld() {
  const sigset_t stop = StopSignals();
  ::pthread_sigmask(SIG_BLOCK, &stop, &old_);
}

InterruptsHeld::~InterruptsHeld() { ::pthread_sigmask(SIG_SETMASK, &old_, nullptr); }

void InterruptsHeld::ThrowIfInterrupted(const std::string& during) const {
  const sigset_t stop = StopSignals();
  const timespec now{0, 0};
  if (const int sig = ::sigtimedwait(&stop, nullptr, &now); sig > 0) g_interrupt = sig;
  msaflow::ThrowIfInterrupted(during);
}

}  // namespace msaflow
