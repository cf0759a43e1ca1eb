#include "record/coordinator_lock.h"

#include <fcntl.h>
#include <unistd.h>

#include "common/error.h"

namespace msaflow::record {
namespace {

std::string LockPath(const std::string& run_dir) { return run_dir + "/coordinator.lock"; }

struct flock WholeFile(short type) {
  struct flock l {};
  l.l_type = type;
  l.l_whence = SEEK_SET;
  l.l_start = 0;
  l.l_len = 0;
  return l;
}

}  // namespace

CoordinatorLock::CoordinatorLock(const std::string& run_dir) {
  const std::string path = LockPath(run_dir);
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) ThrowErrno("open " + path);
  struct flock l = WholeFile(F_WRLCK);
  if (::fcntl(fd_, F_SETLK, &l) != 0) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    if (err == EACCES || err == EAGAIN) {
      const pid_t holder = CoordinatorHolding(run_dir);
      Throw(ErrorKind::kInvalidInput, "run " + run_dir + " is still running (coordinator pid " +
                                          std::to_string(holder) + "); stop it first, or wait for it to end");
    }
    errno = err;
    ThrowErrno("lock " + path);
  }
}

CoordinatorLock::~CoordinatorLock() {
  if (fd_ >= 0) ::close(fd_);  // closing drops the lock
}

pid_t CoordinatorHolding(const std::string& run_dir) {
  const int fd = ::open(LockPath(run_dir).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  struct flock l = WholeFile(F_WRLCK);
  const int rc = ::fcntl(fd, F_GETLK, &l);
  ::close(fd);
  if (rc != 0 || l.l_type == F_UNLCK) return 0;
  return l.l_pid;
}

}  // namespace msaflow::record
