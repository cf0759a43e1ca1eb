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
