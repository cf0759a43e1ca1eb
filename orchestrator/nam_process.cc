#include "orchestrator/nam_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
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

}  // namespace

NamServerProcess::NamServerProcess(const std::string& exe, const NamSpec& spec, const std::string& persist_dir,
                                   const std::string& log_path, const std::string& ready_path) {
  ::unlink(ready_path.c_str());
  std::vector<std::string> args = {exe, "nam", "serve", "--listen", spec.listen, "--provider", spec.provider,
                                   "--capacity", spec.capacity, "--ready-file", ready_path};
  if (!persist_dir.empty()) {
    args.push_back("--persist");
    args.push_back(persist_dir);
  }
  int log = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log < 0) ThrowErrno("open " + log_path);
  pid_ = ::fork();
  if (pid_ < 0) {
    ::close(log);
    ThrowErrno("fork (starting the NAM server)");
  }
  if (pid_ == 0) {
    ::dup2(log, 1);
    ::dup2(log, 2);
    int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, 0);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(exe.c_str(), argv.data());
    ::_exit(127);
  }
  ::close(log);
  auto start = std::chrono::steady_clock::now();
  for (;;) {
    if (PathExists(ready_path)) {
      auto j = nlohmann::json::parse(ReadFile(ready_path), nullptr, false);
      if (!j.is_discarded() && j.contains("uri")) {
        uri_ = j["uri"].get<std::string>();
        return;
      }
    }
    int st = 0;
    if (::waitpid(pid_, &st, WNOHANG) == pid_) {
      pid_ = -1;
      Throw(ErrorKind::kUnavailable, "the NAM server for this run exited at start (" + log_path + "):\n" + Tail(log_path));
    }
    if (std::chrono::steady_clock::now() - start > std::chrono::seconds(30)) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &st, 0);
      pid_ = -1;
      Throw(ErrorKind::kUnavailable, "the NAM server for this run did not come up in 30 s (" + log_path + "):\n" +
                                         Tail(log_path));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

NamServerProcess::~NamServerProcess() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGTERM);
  int st = 0;
  for (int i = 0; i < 1000; ++i) {
    if (::waitpid(pid_, &st, WNOHANG) == pid_) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, &st, 0);
}

}  // namespace msaflow::orchestrator
