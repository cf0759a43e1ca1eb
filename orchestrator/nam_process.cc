#include "orchestrator/nam_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fmt/core.h>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/files.h"

namespace msaflow::orchestrator {
namespace {

std::string Tail(const std::string& path) {
  try {
    std::string s = ReadFile(path);
    if (s.size() > 2000) s = "..." + s.substr(s.size() - 2000);
    while (!s.empty() && s.back() == '\n') s.pop_back();
    return s;
  } catch (const Error&) {
    return "(no log)";
  }
}

// Waits up to `ms` for the child to exit; true once it has been reaped.
bool Reap(pid_t pid, int ms) {
  int st = 0;
  for (int i = 0; i < ms / 10; ++i) {
    if (::waitpid(pid, &st, WNOHANG) == pid) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

}  // namespace

NamServerProcess::NamServerProcess(const std::string& exe, const NamSpec& spec, const std::string& persist_dir,
                                   const std::string& log_path, const std::string& ready_path, const NamLaunch& launch) {
  ::unlink(ready_path.c_str());
  std::vector<std::string> args = launch.prefix;
  for (const std::string& a : {exe, std::string("nam"), std::string("serve"), std::string("--listen"), spec.listen,
                               std::string("--provider"), spec.provider, std::string("--capacity"), spec.capacity,
                               std::string("--ready-file"), ready_path})
    args.push_back(a);
  if (!launch.token_file.empty()) {
    args.push_back("--token-file");
    args.push_back(launch.token_file);
  }
  if (!persist_dir.empty()) {
    args.push_back("--persist");
    args.push_back(persist_dir);
    if (!launch.users_lock.empty()) {
      args.push_back("--users-lock");
      args.push_back(launch.users_lock);
    }
    if (launch.lock_wait_s > 0) {
      args.push_back("--lock-wait");
      args.push_back(fmt::format("{}", launch.lock_wait_s));
    }
  }
  int log = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log < 0) ThrowErrno("open " + log_path);
  pid_t parent = ::getpid();
  pid_ = ::fork();
  if (pid_ < 0) {
    ::close(log);
    ThrowErrno("fork (starting the NAM server)");
  }
  if (pid_ == 0) {
    // If the coordinator dies without stopping it, the server (or its srun, which then ends
    // its Slurm job) is told to stop: no NAM outlives its run.
    if (launch.detached) {
      ::setsid();  // not in the coordinator's process group: a Ctrl-C of one run leaves the others' server
    } else {
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != parent) ::_exit(1);
    }
    ::dup2(log, 1);
    ::dup2(log, 2);
    int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, 0);
    if (launch.own_allocation) {
      // A new job, not a step of the one this coordinator may run in: srun must not see it.
      std::vector<std::string> drop;
      for (char** e = environ; *e; ++e) {
        std::string kv = *e;
        std::string k = kv.substr(0, kv.find('='));
        if (k.rfind("SLURM_", 0) == 0 && k != "SLURM_CONF") drop.push_back(k);
      }
      for (const auto& k : drop) ::unsetenv(k.c_str());
    }
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execvp(argv[0], argv.data());
    std::fprintf(stderr, "cannot run %s: %s\n", argv[0], std::strerror(errno));
    ::_exit(127);
  }
  ::close(log);
  detached_ = launch.detached;
  auto start = std::chrono::steady_clock::now();
  for (;;) {
    if (PathExists(ready_path)) {
      auto j = nlohmann::json::parse(ReadFile(ready_path), nullptr, false);
      if (!j.is_discarded() && j.contains("uri")) {
        uri_ = j["uri"].get<std::string>();
        if (!launch.token_file.empty()) uri_ += (uri_.find('?') == std::string::npos ? "?" : "&") +
                                                std::string("token-file=") + launch.token_file;
        slurm_job_ = j.value("slurm_job", "");
        node_ = j.value("node", "");
        return;
      }
    }
    int st = 0;
    if (::waitpid(pid_, &st, WNOHANG) == pid_) {
      pid_ = -1;
      Throw(ErrorKind::kUnavailable, "the NAM server for this run exited at start (" + log_path + "):\n" + Tail(log_path));
    }
    if (std::chrono::steady_clock::now() - start > std::chrono::duration<double>(launch.start_timeout_s)) {
      ::kill(pid_, SIGTERM);  // srun, if it is one, ends its job on TERM
      if (!Reap(pid_, 5000)) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &st, 0);
      }
      pid_ = -1;
      Throw(ErrorKind::kUnavailable, fmt::format("the NAM server for this run did not come up in {:.0f} s ({}):\n{}",
                                                 launch.start_timeout_s, log_path, Tail(log_path)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

std::string NamServerProcess::Exited() {
  if (pid_ <= 0) return "not running";
  int st = 0;
  if (::waitpid(pid_, &st, WNOHANG) != pid_) return "";
  pid_ = -1;
  if (WIFSIGNALED(st)) return fmt::format("killed by signal {} ({})", WTERMSIG(st), ::strsignal(WTERMSIG(st)));
  return fmt::format("exited with status {}", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
}

NamServerProcess::~NamServerProcess() {
  if (pid_ <= 0) return;
  if (detached_) {
    ::waitpid(pid_, nullptr, WNOHANG);  // reaped if it is gone already; else it outlives this run
    return;
  }
  if (!slurm_job_.empty()) {
    // Under Slurm, SIGTERM to srun would kill the step outright; signal the server itself,
    // so that it stops cleanly and its step, then srun, end.
    pid_t c = ::fork();
    if (c == 0) {
      int devnull = ::open("/dev/null", O_WRONLY);
      if (devnull >= 0) {
        ::dup2(devnull, 1);
        ::dup2(devnull, 2);
      }
      ::execlp("scancel", "scancel", "--signal=TERM", slurm_job_.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    if (c > 0 && !Reap(c, 10000)) {
      ::kill(c, SIGKILL);
      ::waitpid(c, nullptr, 0);
    }
    if (Reap(pid_, 10000)) return;
  }
  ::kill(pid_, SIGTERM);
  if (Reap(pid_, 10000)) return;
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
}

}  // namespace msaflow::orchestrator
