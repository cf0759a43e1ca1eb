#include "launch/launcher.h"

#include <signal.h>
#include <sys/stat.h>

#include <fmt/core.h>

#include <random>

#include "common/error.h"
#include "common/files.h"
#include "launch/local_launcher.h"
#include "launch/slurm.h"
#include "nam/server.h"

namespace msaflow::launch {
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
  launch::ThrowIfInterrupted(during);
}

NamLaunch Launcher::NamServerLaunch() const {
  NamLaunch l;
  l.clock = ctx_.clock;
  if (!NamOnLoopback(m_)) {
    // Off loopback the server needs a token; the run directory is on the file system the
    // modules share, and only this user may read it.
    l.token_file = ctx_.run_dir + "/nam-token";
    std::random_device rd;
    std::string token;
    for (int i = 0; i < 4; ++i) token += fmt::format("{:08x}", rd());
    WriteFileAtomic(l.token_file, token + "\n");
    if (::chmod(l.token_file.c_str(), 0600) != 0) ThrowErrno("chmod " + l.token_file);
  }
  PlaceNamServer(&l);
  return l;
}

Submitted Launcher::Submit(const SubmitRequest&) {
  Throw(ErrorKind::kInvalidInput, "submit: machine '" + m_.name + "' has launcher '" +
                                      workflow::LauncherName(m_.launcher) +
                                      "'; submit needs a Slurm machine file (configs/machines/slurm-local.json) "
                                      "or use `msaflow run`");
}

std::string Launcher::SubmittedJobEnd(const std::string& job) {
  Throw(ErrorKind::kInvalidInput, "job " + job + ": machine '" + m_.name + "' has no batch system to ask");
}

bool NamOnLoopback(const Machine& m) {
  std::string host, port;
  nam::SplitHostPort(m.nam.listen, "machine " + m.name + ": /nam/listen", &host, &port);
  return nam::IsLoopbackHost(host);
}

std::unique_ptr<Launcher> MakeLauncher(const Pipeline& p, const Machine& m, LaunchContext ctx) {
  switch (m.launcher) {
    case workflow::LauncherKind::kLocal:
      return std::make_unique<LocalLauncher>(p, m, std::move(ctx));
    case workflow::LauncherKind::kSlurm:
      return std::make_unique<SlurmLauncher>(p, m, std::move(ctx));
  }
  Throw(ErrorKind::kInternal, "MakeLauncher: unknown launcher kind");
}

}  // namespace msaflow::launch
