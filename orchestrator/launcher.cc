#include "orchestrator/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <deque>

#include "common/error.h"

extern char** environ;

namespace msaflow::orchestrator {
namespace {

struct Child {
  pid_t pid = -1;
  int fd = -1;
  std::string partial;
  std::FILE* log = nullptr;
  std::deque<std::string> tail;  // the last lines, for the failure message
  std::string error;             // the first error line a rank printed
  int status = 0;
  bool exited = false;
};

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

std::vector<std::string> LocalLauncher::Command(const Task& t, const std::string& task_file) const {
  std::vector<std::string> cmd;
  if (t.ranks > 1) cmd = {mpirun_, "-n", std::to_string(t.ranks), "--bind-to", "none"};
  cmd.insert(cmd.end(), {exe_, "module", t.step, "--task", task_file});
  return cmd;
}

namespace {

// The environment of a local step: Open MPI on one machine (shared-memory transport, ranks may
// outnumber cores, root allowed); what the user set wins.
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
  for (char** e = environ; *e; ++e) env.push_back(*e);
  for (const auto& [k, v] : defaults)
    if (!std::getenv(k.c_str())) env.push_back(k + "=" + v);
  return env;
}

// Ends a step and reaps it: mpirun gets SIGTERM (it passes it on to its ranks), SIGKILL after
// 2 s; a single rank gets SIGKILL at once (Open MPI's singleton may have caught SIGTERM).
void StopChild(pid_t pid, bool mpirun) {
  ::kill(pid, mpirun ? SIGTERM : SIGKILL);
  int st = 0;
  for (int i = 0; i < 200; ++i) {
    const pid_t r = ::waitpid(pid, &st, WNOHANG);
    if (r == pid || (r < 0 && errno != EINTR)) return;
    ::usleep(10000);
  }
  ::kill(pid, SIGKILL);
  while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
}

// The first `name` on PATH, or "".
std::string FindOnPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string p = path ? path : "/usr/bin:/bin";
  size_t start = 0;
  while (start <= p.size()) {
    size_t end = p.find(':', start);
    if (end == std::string::npos) end = p.size();
    std::string cand = p.substr(start, end - start) + "/" + name;
    if (::access(cand.c_str(), X_OK) == 0) return cand;
    start = end + 1;
  }
  return "";
}

}  // namespace

LocalLauncher::LocalLauncher(std::string msaflow_exe) : exe_(std::move(msaflow_exe)) {
  mpirun_ = FindOnPath("mpirun");
  if (mpirun_.empty()) mpirun_ = "mpirun";
}

void LocalLauncher::RunRound(const RoundPlan& plan, const std::map<std::string, std::string>& task_files,
                             const std::string& log_dir, const LaunchObserver& obs) {
  const std::vector<std::string> env_s = LocalMpiEnvironment();
  for (const Task& t : plan.tasks) {
    if (obs.on_start) obs.on_start(t);
    auto t0 = std::chrono::steady_clock::now();
    auto argv_s = Command(t, task_files.at(t.id));
    if (t.ranks > 1 && ::access(mpirun_.c_str(), X_OK) != 0)
      Throw(ErrorKind::kUnsupported, "task " + t.id + " needs " + std::to_string(t.ranks) +
                                         " MPI ranks, but mpirun is not on PATH (install openmpi-bin)");
    Child k;
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) ThrowErrno("pipe");
    std::string log_path = log_dir + "/" + t.id + ".log";
    k.log = std::fopen(log_path.c_str(), "w");
    if (!k.log) ThrowErrno("open " + log_path);
    std::vector<std::string> env_copy = env_s;
    std::vector<char*> argv, envp;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (auto& e : env_copy) envp.push_back(e.data());
    envp.push_back(nullptr);
    const pid_t parent = ::getpid();
    k.pid = ::fork();
    if (k.pid == 0) {
      // Only async-signal-safe calls until exec. The step is told to stop when the coordinator
      // dies, even by SIGKILL: no step outlives its run. mpirun gets SIGTERM, which it passes to
      // its ranks before it goes; a single rank gets SIGKILL, because Open MPI's singleton
      // start-up catches SIGTERM (a step killed in MPI_Init was seen to live on, orphaned).
      ::prctl(PR_SET_PDEATHSIG, t.ranks > 1 ? SIGTERM : SIGKILL);
      if (::getppid() != parent) ::_exit(1);
      ::dup2(fds[1], 1);
      ::dup2(fds[1], 2);
      ::execve(argv[0], argv.data(), envp.data());
      ::_exit(127);
    }
    const int fork_errno = errno;
    ::close(fds[1]);
    if (k.pid < 0) {
      ::close(fds[0]);
      std::fclose(k.log);
      errno = fork_errno;
      ThrowErrno("start " + argv_s[0]);
    }
    k.fd = fds[0];
    // Relay output line by line until the step (mpirun and its ranks) has closed the pipe.
    while (k.fd >= 0) {
      pollfd pfd{k.fd, POLLIN, 0};
      const int ready = ::poll(&pfd, 1, kLivenessPollMs);
      if (ready == 0) {
        if (std::string why = obs.check ? obs.check() : ""; !why.empty()) {
          StopChild(k.pid, t.ranks > 1);
          ::close(k.fd);
          std::fclose(k.log);
          Throw(ErrorKind::kUnavailable, why + "; task " + t.id + " was stopped");
        }
        continue;
      }
      if (ready < 0) {
        if (errno != EINTR) ThrowErrno("poll");
        if (int sig = InterruptSignal()) {
          StopChild(k.pid, t.ranks > 1);
          ::close(k.fd);
          std::fclose(k.log);
          Throw(ErrorKind::kTaskFailed, "interrupted by signal " + std::to_string(sig) + " during task " + t.id +
                                            "; its processes were stopped");
        }
        continue;
      }
      char buf[4096];
      ssize_t n = ::read(k.fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n > 0) k.partial.append(buf, static_cast<size_t>(n));
      if (n <= 0) {
        if (!k.partial.empty()) k.partial.push_back('\n');
        ::close(k.fd);
        k.fd = -1;
      }
      size_t pos;
      while ((pos = k.partial.find('\n')) != std::string::npos) {
        std::string line = k.partial.substr(0, pos);
        k.partial.erase(0, pos + 1);
        std::fprintf(k.log, "%s\n", line.c_str());
        std::fflush(k.log);
        k.tail.push_back(line);
        if (k.tail.size() > 5) k.tail.pop_front();
        if (k.error.empty() && (line.find("msaflow: error: ") != std::string::npos ||
                                line.find("msaflow: internal error: ") != std::string::npos))
          k.error = line;
        if (obs.on_line) obs.on_line(t, line);
      }
    }
    while (::waitpid(k.pid, &k.status, 0) < 0 && errno == EINTR) {
    }
    std::fclose(k.log);
    if (!(WIFEXITED(k.status) && WEXITSTATUS(k.status) == 0)) {
      std::string how = WIFEXITED(k.status) ? "exit status " + std::to_string(WEXITSTATUS(k.status))
                                            : "signal " + std::to_string(WTERMSIG(k.status));
      std::string failure = "task " + t.id + (t.ranks > 1 ? " (" + std::to_string(t.ranks) + " ranks)" : "") +
                            " failed with " + how + "; log " + log_path;
      // The error line a rank printed says more than mpirun's closing words.
      std::string said = k.error;
      if (said.empty() && !k.tail.empty()) said = k.tail.back();
      if (!said.empty()) failure += "\n  last output: " + said;
      Throw(ErrorKind::kTaskFailed, failure);
    }
    if (obs.on_end) obs.on_end(t, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
}

}  // namespace msaflow::orchestrator
