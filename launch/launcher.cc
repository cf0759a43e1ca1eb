#include "launch/launcher.h"

#include <fmt/core.h>
#include <signal.h>
#include <sys/stat.h>

#include <random>

#include "common/error.h"
#include "common/files.h"
#include "launch/local_launcher.h"
#include "launch/slurm_launcher.h"
#include "nam/server.h"

namespace msaflow::launch {
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
