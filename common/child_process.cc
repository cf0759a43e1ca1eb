#include "common/child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "common/error.h"

extern char** environ;

namespace msaflow {

std::string ExitStatus::Describe() const {
  if (signal) return "signal " + std::to_string(signal) + " (" + ::strsignal(signal) + ")";
  return "exit status " + std::to_string(code);
}

ExitStatus ExitStatus::FromWait(int st) {
  ExitStatus e;
  if (WIFEXITED(st)) e.code = WEXITSTATUS(st);
  if (WIFSIGNALED(st)) e.signal = WTERMSIG(st);
  return e;
}

std::string FindOnPath(const std::string& name) {
  if (name.find('/') != std::string::npos) return ::access(name.c_str(), X_OK) == 0 ? name : "";
  const char* path = std::getenv("PATH");
  const std::string p = path ? path : "/usr/bin:/bin";
  size_t start = 0;
  while (start <= p.size()) {
    size_t end = p.find(':', start);
    if (end == std::string::npos) end = p.size();
    const std::string dir = p.substr(start, end - start);
    std::string cand = (dir.empty() ? "." : dir) + "/" + name;
    if (::access(cand.c_str(), X_OK) == 0) return cand;
    start = end + 1;
  }
  return "";
}

namespace {

void CloseFd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// The child's environment, made before fork.
std::vector<std::string> Environment(const SpawnOptions& opt) {
  std::vector<std::string> env;
  auto name_of = [](const std::string& kv) { return kv.substr(0, kv.find('=')); };
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    const std::string name = name_of(kv);
    if (opt.drop_env && opt.drop_env(name)) continue;
    bool replaced = false;
    for (const auto& s : opt.set_env) replaced |= name_of(s) == name;
    if (!replaced) env.push_back(kv);
  }
  env.insert(env.end(), opt.set_env.begin(), opt.set_env.end());
  return env;
}

}  // namespace

ChildProcess ChildProcess::Start(const std::vector<std::string>& argv_in, const SpawnOptions& opt) {
  if (argv_in.empty()) Throw(ErrorKind::kInternal, "ChildProcess::Start: no command");
  const std::string exe = FindOnPath(argv_in[0]);
  if (exe.empty())
    Throw(ErrorKind::kNotFound, "cannot run " + argv_in[0] +
                                    (argv_in[0].find('/') == std::string::npos ? ": not found on PATH"
                                                                               : ": no such executable file"));
  std::vector<std::string> args = argv_in, env = Environment(opt);
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);

  // The descriptors the child gets: {read end kept here, write end for the child}.
  int out[2] = {-1, -1}, err[2] = {-1, -1}, in = -1;
  auto close_all = [&] {
    for (int* fd : {&out[0], &out[1], &err[0], &err[1], &in}) CloseFd(*fd);
  };
  using Output = SpawnOptions::Output;
  if (opt.output == Output::kPipe) {
    if (::pipe2(out, O_CLOEXEC) != 0 || (opt.separate_stderr && ::pipe2(err, O_CLOEXEC) != 0)) {
      const int e = errno;
      close_all();
      errno = e;
      ThrowErrno("pipe");
    }
  } else if (opt.output == Output::kFile || opt.output == Output::kNull) {
    const std::string path = opt.output == Output::kFile ? opt.output_file : "/dev/null";
    out[1] = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (out[1] < 0) ThrowErrno("open " + path);
  }
  if (opt.stdin_null && (in = ::open("/dev/null", O_RDONLY | O_CLOEXEC)) < 0) {
    const int e = errno;
    close_all();
    errno = e;
    ThrowErrno("open /dev/null");
  }
  const pid_t parent = ::getpid();
  sigset_t none;
  sigemptyset(&none);
  const pid_t pid = ::fork();
  if (pid == 0) {
    // Only async-signal-safe calls from here to exec. The child starts with no signal held back,
    // whatever this thread held (the service holds SIGINT/SIGTERM in all its threads).
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    if (opt.death_signal) {
      ::prctl(PR_SET_PDEATHSIG, opt.death_signal);
      if (::getppid() != parent) ::_exit(1);  // the parent died before prctl took hold
    }
    if (opt.new_session) ::setsid();
    if (in >= 0) ::dup2(in, 0);
    if (out[1] >= 0) {
      ::dup2(out[1], 1);
      ::dup2(err[1] >= 0 ? err[1] : out[1], 2);
    }
    ::execve(exe.c_str(), argv.data(), envp.data());
    static const char kMsg[] = "cannot exec the program\n";
    [[maybe_unused]] ssize_t n = ::write(2, kMsg, sizeof kMsg - 1);
    ::_exit(127);
  }
  const int fork_errno = errno;
  CloseFd(out[1]);
  CloseFd(err[1]);
  CloseFd(in);
  if (pid < 0) {
    close_all();
    errno = fork_errno;
    ThrowErrno("start " + argv_in[0]);
  }
  ChildProcess c;
  c.pid_ = pid;
  c.out_fd_ = out[0];
  c.err_fd_ = err[0];
  return c;
}

ChildProcess::ChildProcess(ChildProcess&& o) noexcept { *this = std::move(o); }

ChildProcess& ChildProcess::operator=(ChildProcess&& o) noexcept {
  if (this != &o) {
    Reset();
    pid_ = o.pid_, out_fd_ = o.out_fd_, err_fd_ = o.err_fd_, status_ = o.status_;
    o.pid_ = -1, o.out_fd_ = o.err_fd_ = -1, o.status_.reset();
  }
  return *this;
}

ChildProcess::~ChildProcess() { Reset(); }

void ChildProcess::Reset() {
  CloseOutput();
  if (pid_ > 0 && !status_) {
    Signal(SIGKILL);
    Wait();
  }
  pid_ = -1;
  status_.reset();
}

void ChildProcess::CloseOutput() {
  CloseFd(out_fd_);
  CloseFd(err_fd_);
}

std::optional<ExitStatus> ChildProcess::Poll() {
  if (status_ || pid_ <= 0) return status_;
  int st = 0;
  pid_t r;
  while ((r = ::waitpid(pid_, &st, WNOHANG)) < 0 && errno == EINTR) {
  }
  if (r == pid_) status_ = ExitStatus::FromWait(st);
  else if (r < 0) status_ = ExitStatus{};  // not our child any more (reaped elsewhere): gone
  return status_;
}

ExitStatus ChildProcess::Wait() {
  if (status_ || pid_ <= 0) return status_.value_or(ExitStatus{});
  int st = 0;
  pid_t r;
  while ((r = ::waitpid(pid_, &st, 0)) < 0 && errno == EINTR) {
  }
  status_ = r == pid_ ? ExitStatus::FromWait(st) : ExitStatus{};
  return *status_;
}

std::optional<ExitStatus> ChildProcess::WaitFor(double seconds, Clock& clock) {
  const Clock::TimePoint start = clock.Now();
  for (;;) {
    if (auto s = Poll()) return s;
    if (clock.SecondsSince(start) >= seconds) return std::nullopt;
    clock.SleepSeconds(0.005);
  }
}

void ChildProcess::Signal(int sig) {
  if (pid_ > 0 && !status_) ::kill(pid_, sig);
}

ExitStatus ChildProcess::Stop(int sig, double grace_s) {
  Signal(sig);
  if (sig != SIGKILL)
    if (auto s = WaitFor(grace_s)) return *s;
  Signal(SIGKILL);
  return Wait();
}

namespace {

std::mutex released_mu;
std::vector<pid_t>& Released() {
  static std::vector<pid_t> pids;
  return pids;
}

}  // namespace

void ChildProcess::Release() {
  CloseOutput();
  if (pid_ > 0 && !status_) {
    std::lock_guard<std::mutex> lock(released_mu);
    Released().push_back(pid_);
  }
  pid_ = -1;
  status_.reset();
}

size_t ReapReleasedChildren() {
  std::lock_guard<std::mutex> lock(released_mu);
  auto& pids = Released();
  std::vector<pid_t> running;
  for (pid_t pid : pids) {
    int st = 0;
    pid_t r;
    do {
      r = ::waitpid(pid, &st, WNOHANG);
    } while (r < 0 && errno == EINTR);
    if (r == 0) running.push_back(pid);  // still running; ended (r == pid) or not ours any more (ECHILD): dropped
  }
  pids.swap(running);
  return pids.size();
}

Captured RunCaptured(const std::vector<std::string>& argv, SpawnOptions opt, double timeout_s) {
  Captured r;
  opt.output = SpawnOptions::Output::kPipe;
  opt.separate_stderr = true;
  ChildProcess c;
  try {
    c = ChildProcess::Start(argv, opt);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kNotFound) throw;
    r.status.code = 127;
    r.err = std::string(e.what()) + "\n";
    return r;
  }
  pollfd fds[2] = {{c.output_fd(), POLLIN, 0}, {c.error_fd(), POLLIN, 0}};
  int open = 2;
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (open > 0) {
    const int left = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now()).count());
    const int n = left > 0 ? ::poll(fds, 2, left) : 0;
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      r.timed_out = true;
      break;
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !fds[i].revents) continue;
      char buf[4096];
      const ssize_t got = ::read(fds[i].fd, buf, sizeof buf);
      if (got > 0) {
        (i == 0 ? r.out : r.err).append(buf, static_cast<size_t>(got));
      } else if (got == 0 || errno != EINTR) {
        fds[i].fd = -1;
        --open;
      }
    }
  }
  c.CloseOutput();
  r.status = r.timed_out ? c.Stop(SIGKILL, 0) : c.Wait();
  return r;
}

}  // namespace msaflow
