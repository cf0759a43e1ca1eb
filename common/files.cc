#include "common/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <filesystem>
#include <random>

#include "common/error.h"

namespace msaflow {
namespace {

void WriteAll(int fd, std::string_view data, const std::string& path) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::write(fd, data.data() + off, data.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      ThrowErrno("write " + path);
    }
    off += static_cast<size_t>(n);
  }
}

void SyncDir(const std::string& dir) {
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) ThrowErrno("open directory " + dir);
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

std::string ReadInputFile(const std::string& path, const std::string& what, uint64_t max_bytes) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT) Throw(ErrorKind::kNotFound, path + ": no such file");
    ThrowErrno("open " + path);
  }
  struct stat st {};
  const bool ok = ::fstat(fd, &st) == 0;
  ::close(fd);
  if (!ok) ThrowErrno("stat " + path);
  if (!S_ISREG(st.st_mode))
    Throw(ErrorKind::kInvalidInput, path + ": not a regular file (" +
                                        (S_ISDIR(st.st_mode)    ? "a directory"
                                         : S_ISFIFO(st.st_mode) ? "a FIFO"
                                         : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device"
                                                                                      : "a socket or other special file") +
                                        "); expected " + what);
  if (static_cast<uint64_t>(st.st_size) > max_bytes)
    Throw(ErrorKind::kInvalidInput, path + ": " + std::to_string(st.st_size) + " bytes; " + what + " is at most " +
                                        std::to_string(max_bytes) + " bytes");
  std::string out = ReadFile(path);
  if (out.size() > max_bytes)  // grown since
    Throw(ErrorKind::kInvalidInput, path + ": over " + std::to_string(max_bytes) + " bytes; " + what + " is at most that");
  return out;
}

std::string ReadFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) Throw(ErrorKind::kNotFound, path + ": no such file");
    ThrowErrno("open " + path);
  }
  std::string out;
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      ::close(fd);
      errno = e;
      ThrowErrno("read " + path);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

void WriteFileAtomic(const std::string& path, std::string_view data) { WriteFileAtomic(path, {data}); }

bool IsAtomicWriteLeftover(const std::string& file_name) {
  // ".tmp.<pid>.<random>" (and "<name>.tmp.<pid>.<random>" from earlier versions).
  size_t t = file_name.rfind(".tmp.");
  if (t == std::string::npos) return false;
  std::string rest = file_name.substr(t + 5);
  size_t dot = rest.find('.');
  if (dot == std::string::npos || dot == 0 || dot + 1 == rest.size()) return false;
  for (size_t i = 0; i < rest.size(); ++i)
    if (i != dot && !std::isdigit(static_cast<unsigned char>(rest[i]))) return false;
  return true;
}

void WriteFileAtomic(const std::string& path, std::initializer_list<std::string_view> parts) {
  std::filesystem::path p(path);
  std::string dir = p.parent_path().string();
  if (!dir.empty()) MakeDirs(dir);
  // A short temporary name beside the target (rename is atomic within a directory), whatever
  // the length of the target's own name.
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string tmp;
  int fd = -1;
  for (int attempt = 0; fd < 0; ++attempt) {
    tmp = (dir.empty() ? std::string() : dir + "/") + ".tmp." + std::to_string(::getpid()) + "." +
          std::to_string(rng() % 1000000000);
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0 && (errno != EEXIST || attempt >= 8)) ThrowErrno("create " + tmp + " (to write " + path + ")");
  }
  try {
    for (std::string_view data : parts) WriteAll(fd, data, tmp);
    if (::fsync(fd) != 0) ThrowErrno("fsync " + tmp);
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    errno = e;
    ThrowErrno("rename " + tmp + " -> " + path);
  }
  SyncDir(dir);
}

void AppendLineSynced(const std::string& path, std::string_view line) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) ThrowErrno("open " + path);
  try {
    std::string l(line);
    l.push_back('\n');
    WriteAll(fd, l, path);
    if (::fsync(fd) != 0) ThrowErrno("fsync " + path);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
}

bool PathExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

void MakeDirs(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) Throw(ErrorKind::kIo, "create directory " + path + ": " + ec.message());
}

std::string ReadBootId() {
  try {
    std::string s = ReadFile("/proc/sys/kernel/random/boot_id");
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    return s;
  } catch (const Error&) {
    return "";
  }
}

}  // namespace msaflow
