#include "launch/local_launcher.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>

#include "common/child_process.h"
#include "common/error.h"
#include "common/signals.h"

namespace msaflow::launch {

std::vector<std::string> LocalLauncher::Command(const Task& t, const std::string& task_file) const {
  std::vector<std::string> cmd;
  if (t.ranks > 1) cmd = {mpirun_, "-n", std::to_string(t.ranks), "--bind-to", "none"};
  cmd.insert(cmd.end(), {ctx_.msaflow_exe, "module", workflow::StepName(t.step), "--task", task_file});
  return cmd;
}

namespace {

// What a local step's environment adds: Open MPI on one machine (shared-memory transport, ranks
// may outnumber cores, root allowed); what the user set wins.
std::vector<std::string> LocalMpiEnvironment() {
  const std::vector<std::pair<std::string, std::string>> defaults = {
      {"OMPI_MCA_pml", "ob1"},  // skips probing for network transports: a rank starts in 0.2 s, not 0.4 s
      {"OMPI_MCA_btl", "self,vader"},
      {"OMPI_MCA_rmaps_base_oversubscribe", "1"},
      // A stopped step (the coordinator died, or its NAM server did) ends at once: mpirun
      // passes SIGTERM on and kills what is left without its default 1 s wait.
      {"OMPI_MCA_odls_base_sigkill_timeout", "0"},
      {"OMPI_ALLOW_RUN_AS_ROOT", "1"},
      {"OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"}};
  std::vector<std::string> env;
  for (const auto& [k, v] : defaults)
    if (!std::getenv(k.c_str())) env.push_back(k + "=" + v);
  return env;
}

// The signal that stops a step: mpirun gets SIGTERM, which it passes to its ranks before it
// goes; a single rank gets SIGKILL, because Open MPI's singleton start-up catches SIGTERM (a
// step killed in MPI_Init was seen to live on, orphaned). The same signal is the step's
// parent-death signal, so no step outlives its coordinator, even one killed by SIGKILL.
int StopSignal(const Task& t) { return t.ranks > 1 ? SIGTERM : SIGKILL; }

// One attempt of a task: its output relayed line by line to the log and the observer until the
// step has closed the pipe, then its exit status.
struct Attempt {
  ExitStatus status;
  std::string said;  // the first error line a rank printed, else the last line
  int rank = -1, rank_signal = 0;  // mpirun: the first rank a signal ended, and the signal
};

Attempt RunAttempt(const Task& t, const std::vector<std::string>& argv, const std::vector<std::string>& env,
                   const std::string& log_path, bool append, const LaunchObserver& obs) {
  std::FILE* log = std::fopen(log_path.c_str(), append ? "a" : "w");
  if (!log) ThrowErrno("open " + log_path);
  struct Closer {
    std::FILE* f;
    ~Closer() { std::fclose(f); }
  } closer{log};
  SpawnOptions opt;
  opt.output = SpawnOptions::Output::kPipe;
  opt.death_signal = StopSignal(t);
  opt.set_env = env;
  ChildProcess child = ChildProcess::Start(argv, opt);
  std::string partial, error;
  int rank = -1, rank_signal = 0;
  std::deque<std::string> tail;  // the last lines, for the failure message
  int fd = child.output_fd();
  while (fd >= 0) {
    // Checked before every wait, not only when poll is interrupted: a signal that arrives
    // while this loop reads or writes the log sets the flag without interrupting any poll,
    // and would otherwise be noticed only when the step ends (a cancel then waited for it).
    if (int sig = InterruptSignal()) {
      child.Stop(StopSignal(t), 2.0);
      Throw(ErrorKind::kTaskFailed, "interrupted by signal " + std::to_string(sig) + " during task " + t.id +
                                        "; its processes were stopped");
    }
    pollfd pfd{fd, POLLIN, 0};
    const int ready = ::poll(&pfd, 1, kLivenessPollMs);
    if (ready == 0) {
      if (std::string why = obs.check ? obs.check() : ""; !why.empty()) {
        child.Stop(StopSignal(t), 2.0);
        Throw(ErrorKind::kUnavailable, why + "; task " + t.id + " was stopped");
      }
      continue;
    }
    if (ready < 0) {
      if (errno != EINTR) ThrowErrno("poll");
      continue;  // the signal's flag is looked at above
    }
    char buf[4096];
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n > 0) partial.append(buf, static_cast<size_t>(n));
    if (n <= 0) {
      if (!partial.empty()) partial.push_back('\n');
      child.CloseOutput();
      fd = -1;
    }
    size_t pos;
    while ((pos = partial.find('\n')) != std::string::npos) {
      std::string line = partial.substr(0, pos);
      partial.erase(0, pos + 1);
      std::fprintf(log, "%s\n", line.c_str());
      std::fflush(log);
      tail.push_back(line);
      if (tail.size() > 5) tail.pop_front();
      if (error.empty() && (line.find("msaflow: error: ") != std::string::npos ||
                            line.find("msaflow: internal error: ") != std::string::npos))
        error = line;
      if (t.ranks > 1 && rank_signal == 0) LocalLauncher::RankSignal(line, &rank, &rank_signal);
      if (obs.on_line) obs.on_line(t, line);
    }
  }
  Attempt a{child.Wait(), error, rank, rank_signal};
  // mpirun exits 128 + N when a signal ended a rank, but names the rank only when it notices
  // that first (another rank may exit first on losing its peer). msaflow's modules exit with
  // codes below 128 (docs/cli.md), so a higher code from mpirun is a rank's signal.
  if (t.ranks > 1 && a.rank_signal == 0 && a.status.signal == 0 && a.status.code > 128 && a.status.code <= 128 + 64)
    a.rank_signal = a.status.code - 128;
  if (a.said.empty() && !tail.empty()) a.said = tail.back();
  if (!a.status.ok()) std::fprintf(log, "msaflow: this attempt ended with %s\n", a.status.Describe().c_str());
  return a;
}

}  // namespace

LocalLauncher::LocalLauncher(Pipeline p, Machine m, LaunchContext ctx)
    : Launcher(std::move(p), std::move(m), std::move(ctx)) {
  mpirun_ = FindOnPath("mpirun");
  if (mpirun_.empty()) mpirun_ = "mpirun";
}

std::string LocalLauncher::FailureReason(const ExitStatus& s, int rank_signal) {
  return s.signal || rank_signal ? "SIGNALED" : "FAILED";
}

bool LocalLauncher::RankSignal(const std::string& line, int* rank, int* signal) {
  const auto at = line.find("process rank "), on = line.find(" exited on signal ");
  if (at == std::string::npos || on == std::string::npos || on < at) return false;
  char* end = nullptr;
  const long r = std::strtol(line.c_str() + at + 13, &end, 10);
  if (end == line.c_str() + at + 13) return false;
  const long s = std::strtol(line.c_str() + on + 18, &end, 10);
  if (end == line.c_str() + on + 18 || s <= 0 || s > 64 || r < 0) return false;
  *rank = static_cast<int>(r);
  *signal = static_cast<int>(s);
  return true;
}

void LocalLauncher::RunRound(const RoundPlan& plan, const std::map<std::string, std::string>& task_files,
                             const std::string& log_dir, const LaunchObserver& obs) {
  const std::vector<std::string> env = LocalMpiEnvironment();
  for (const Task& t : plan.tasks) {
    if (t.ranks > 1 && ::access(mpirun_.c_str(), X_OK) != 0)
      Throw(ErrorKind::kUnsupported, "task " + t.id + " needs " + std::to_string(t.ranks) +
                                         " MPI ranks, but mpirun is not on PATH (install openmpi-bin)");
    if (obs.on_start) obs.on_start(t);
    const auto t0 = ctx_.clock->Now();
    const std::string log_path = log_dir + "/" + t.id + ".log";
    for (int attempt = 0;; ++attempt) {
      const Attempt a = RunAttempt(t, Command(t, task_files.at(t.id)), env, log_path, attempt > 0, obs);
      if (a.status.ok()) break;
      const std::string reason = FailureReason(a.status, a.rank_signal);
      std::string status = a.status.Describe();
      if (a.rank_signal)  // mpirun's exit status says only that something failed
        status += " (" + (a.rank >= 0 ? "rank " + std::to_string(a.rank) : std::string("a rank")) + " ended by " +
                  ExitStatus{-1, a.rank_signal}.Describe() + ")";
      std::string failure = "task " + t.id + (t.ranks > 1 ? " (" + std::to_string(t.ranks) + " ranks)" : "") +
                            " failed with " + status +
                            (retries() > 0 ? " on attempt " + std::to_string(attempt + 1) + " of " +
                                                std::to_string(retries() + 1)
                                          : "") +
                            "; log " + log_path;
      // The error line a rank printed says more than mpirun's closing words.
      if (!a.said.empty()) failure += "\n  last output: " + a.said;
      const bool retry =
          attempt < retries() && std::find(retry_on().begin(), retry_on().end(), reason) != retry_on().end();
      if (!retry) Throw(ErrorKind::kTaskFailed, failure);
      if (obs.on_event)
        obs.on_event("task-retry", {{"task", t.id}, {"step", t.step}, {"round", plan.round}, {"attempt", attempt},
                                    {"attempts", retries() + 1}, {"reason", reason}, {"status", status},
                                    {"message", failure}});
    }
    if (obs.on_end) obs.on_end(t, ctx_.clock->SecondsSince(t0));
  }
}

std::string LocalLauncher::PlanNam(const std::string& nam, const std::string& persist_dir) const {
  if (nam != "serve") return nam;
  return "fabric://<started for the run: " + m_.nam.provider + " on " + m_.nam.listen + ", " + m_.nam.capacity +
         ", persisting to " + persist_dir + ">";
}

std::string LocalLauncher::PlanText(const RoundPlan& rp, const std::string& nam, const std::string& runs_dir) const {
  (void)runs_dir;
  std::string out = fmt::format("plan for {} on machine {} (launcher local), NAM {}\n", p_.name, m_.name, nam);
  out += fmt::format("round 1 of up to {}; later rounds: {} candidates by strategy '{}', top {} kept\n", p_.rounds.max,
                     p_.rounds.candidates, workflow::StrategyName(p_.rounds.strategy), p_.rounds.top_k);
  for (const auto& t : rp.tasks) {
    out += fmt::format("  {:<12} module {:<3} ranks {}{}\n", t.id, t.module, t.ranks,
                       t.after.empty() ? "" : "  after " + t.after[0]);
    std::string line;
    for (const auto& a : Command(t, "runs/<run-id>/tasks/" + t.id + ".json")) line += (line.empty() ? "" : " ") + a;
    out += fmt::format("      {}{}\n", t.ranks > 1 ? fmt::format("{} x ", t.ranks) : "", line);
  }
  out += "candidates of round 1:\n";
  for (const auto& c : workflow::FirstRound(p_))
    out += fmt::format("  {:<8} {:<12} {} seed {}\n", c.id, c.backbone, workflow::HeadLabel(c.head), c.head.seed);
  return out;
}

}  // namespace msaflow::launch
