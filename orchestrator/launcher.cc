#include "orchestrator/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
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
  int rank = 0;
  std::string partial;
  std::FILE* log = nullptr;
  std::deque<std::string> tail;
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
  return {exe_, "module", t.step, "--task", task_file};
}

void LocalLauncher::RunRound(const RoundPlan& plan, const std::map<std::string, std::string>& task_files,
                             const std::string& log_dir, const LaunchObserver& obs) {
  for (const Task& t : plan.tasks) {
    if (obs.on_start) obs.on_start(t);
    auto t0 = std::chrono::steady_clock::now();
    std::vector<Child> kids(static_cast<size_t>(t.ranks));
    auto argv_s = Command(t, task_files.at(t.id));
    for (int r = 0; r < t.ranks; ++r) {
      Child& k = kids[static_cast<size_t>(r)];
      k.rank = r;
      int fds[2];
      if (::pipe2(fds, O_CLOEXEC) != 0) ThrowErrno("pipe");
      std::string log_path = log_dir + "/" + t.id + (t.ranks > 1 ? "." + std::to_string(r) : "") + ".log";
      k.log = std::fopen(log_path.c_str(), "w");
      if (!k.log) ThrowErrno("open " + log_path);
      posix_spawn_file_actions_t fa;
      posix_spawn_file_actions_init(&fa);
      posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
      posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
      std::vector<std::string> env_s;
      for (char** e = environ; *e; ++e)
        if (std::strncmp(*e, "MSAFLOW_RANK=", 13) != 0 && std::strncmp(*e, "MSAFLOW_SIZE=", 13) != 0) env_s.push_back(*e);
      env_s.push_back("MSAFLOW_RANK=" + std::to_string(r));
      env_s.push_back("MSAFLOW_SIZE=" + std::to_string(t.ranks));
      std::vector<char*> argv, envp;
      for (auto& a : argv_s) argv.push_back(a.data());
      argv.push_back(nullptr);
      for (auto& e : env_s) envp.push_back(e.data());
      envp.push_back(nullptr);
      int rc = posix_spawn(&k.pid, exe_.c_str(), &fa, nullptr, argv.data(), envp.data());
      posix_spawn_file_actions_destroy(&fa);
      ::close(fds[1]);
      if (rc != 0) {
        ::close(fds[0]);
        errno = rc;
        ThrowErrno("start " + exe_);
      }
      k.fd = fds[0];
    }
    // Relay output line by line until every rank has closed its pipe.
    size_t open = kids.size();
    while (open > 0) {
      std::vector<pollfd> pfds;
      for (auto& k : kids)
        if (k.fd >= 0) pfds.push_back({k.fd, POLLIN, 0});
      if (::poll(pfds.data(), pfds.size(), -1) < 0) {
        if (errno != EINTR) ThrowErrno("poll");
        if (int sig = InterruptSignal()) {
          for (auto& k : kids) ::kill(k.pid, SIGTERM);
          for (auto& k : kids) {
            while (::waitpid(k.pid, &k.status, 0) < 0 && errno == EINTR) {
            }
            if (k.fd >= 0) ::close(k.fd);
            std::fclose(k.log);
          }
          Throw(ErrorKind::kTaskFailed, "interrupted by signal " + std::to_string(sig) + " during task " + t.id +
                                            "; its processes were stopped");
        }
        continue;
      }
      for (auto& k : kids) {
        if (k.fd < 0) continue;
        bool ready = false;
        for (auto& p : pfds)
          if (p.fd == k.fd && p.revents) ready = true;
        if (!ready) continue;
        char buf[4096];
        ssize_t n = ::read(k.fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n > 0) k.partial.append(buf, static_cast<size_t>(n));
        if (n <= 0) {
          if (!k.partial.empty()) k.partial.push_back('\n');
          ::close(k.fd);
          k.fd = -1;
          --open;
        }
        size_t pos;
        while ((pos = k.partial.find('\n')) != std::string::npos) {
          std::string line = k.partial.substr(0, pos);
          k.partial.erase(0, pos + 1);
          std::fprintf(k.log, "%s\n", line.c_str());
          std::fflush(k.log);
          k.tail.push_back(line);
          if (k.tail.size() > 5) k.tail.pop_front();
          if (obs.on_line) obs.on_line(t, t.ranks > 1 ? "[" + std::to_string(k.rank) + "] " + line : line);
        }
      }
    }
    std::string failure;
    for (auto& k : kids) {
      while (::waitpid(k.pid, &k.status, 0) < 0 && errno == EINTR) {
      }
      std::fclose(k.log);
      bool ok = WIFEXITED(k.status) && WEXITSTATUS(k.status) == 0;
      if (!ok && failure.empty()) {
        std::string how = WIFEXITED(k.status) ? "exit status " + std::to_string(WEXITSTATUS(k.status))
                                              : "signal " + std::to_string(WTERMSIG(k.status));
        failure = "task " + t.id + " (rank " + std::to_string(k.rank) + ") failed with " + how + "; log " + log_dir +
                  "/" + t.id + (t.ranks > 1 ? "." + std::to_string(k.rank) : "") + ".log";
        if (!k.tail.empty()) failure += "\n  last output: " + k.tail.back();
      }
    }
    if (!failure.empty()) Throw(ErrorKind::kTaskFailed, failure);
    if (obs.on_end) obs.on_end(t, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
}

}  // namespace msaflow::orchestrator
