#include "launch/shared_nam.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/child_process.h"
#include "common/error.h"
#include "common/files.h"

namespace msaflow::launch {
namespace {

// Opens `path` and takes a flock on it (blocking); returns the descriptor.
int LockFile(const std::string& path, int how) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) ThrowErrno("open " + path);
  while (::flock(fd, how) != 0) {
    if (errno == EINTR) continue;
    const int err = errno;
    ::close(fd);
    errno = err;
    ThrowErrno("lock " + path);
  }
  return fd;
}

}  // namespace

SharedNamServer::SharedNamServer(const std::string& exe, const NamSpec& spec, const std::string& runs_dir,
                                 double lock_wait_s) {
  const std::string runs = std::filesystem::absolute(runs_dir).lexically_normal().string();
  MakeDirs(runs);
  persist_ = runs + "/nam";
  log_ = runs + "/nam-server.log";
  const std::string ready = runs + "/nam-server.json";
  // One run at a time finds or starts the server; the others wait here the moment that takes.
  const int start_fd = LockFile(runs + "/nam-server.start", LOCK_EX);
  try {
    users_fd_ = LockFile(runs + "/nam-server.users", LOCK_SH);
    ReapReleasedChildren();  // a server this process started for an earlier run may have stopped since
    nlohmann::json j;
    if (PathExists(ready)) j = nlohmann::json::parse(ReadFile(ready), nullptr, false);
    const bool serving = j.is_object() && j.contains("uri") && j["uri"].is_string() && j.contains("pid") &&
                         j["pid"].is_number_integer() && ::kill(j["pid"].get<pid_t>(), 0) == 0;
    if (serving) {
      uri_ = j["uri"].get<std::string>();
      pid_ = j["pid"].get<pid_t>();
    } else {
      NamLaunch launch;
      launch.detached = true;
      launch.users_lock = runs + "/nam-server.users";
      launch.lock_wait_s = lock_wait_s;
      started_ = std::make_unique<NamServerProcess>(exe, spec, persist_, log_, ready, launch);
      uri_ = started_->uri();
      pid_ = started_->pid();
    }
  } catch (...) {
    ::close(start_fd);
    if (users_fd_ >= 0) ::close(users_fd_);
    throw;
  }
  ::close(start_fd);
}

SharedNamServer::~SharedNamServer() {
  if (users_fd_ >= 0) ::close(users_fd_);
}

std::string SharedNamServer::Exited() {
  if (started_) return started_->Exited();
  ReapReleasedChildren();  // else an ended server this process started stays a zombie, "alive" to kill()
  if (::kill(pid_, 0) == 0 || errno == EPERM) return "";
  return "is gone";
}

}  // namespace msaflow::launch
