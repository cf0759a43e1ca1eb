#include "nam/pool.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cctype>
#include <cmath>

#include "common/error.h"

namespace msaflow::nam {

Pool::Pool(uint64_t capacity) : capacity_(Rounded(capacity)) {
  if (capacity_ == 0) Throw(ErrorKind::kInvalidInput, "NAM pool capacity must be positive");
  fd_ = ::memfd_create("msaflow-nam-pool", MFD_CLOEXEC);
  if (fd_ < 0) ThrowErrno("memfd_create");
  if (::ftruncate(fd_, static_cast<off_t>(capacity_)) != 0) {
    ::close(fd_);
    ThrowErrno("sizing the NAM pool to " + std::to_string(capacity_) + " bytes");
  }
  void* p = ::mmap(nullptr, capacity_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (p == MAP_FAILED) {
    ::close(fd_);
    ThrowErrno("mapping the NAM pool");
  }
  base_ = static_cast<char*>(p);
  free_[0] = capacity_;
}

Pool::~Pool() {
  if (base_) ::munmap(base_, capacity_);
  if (fd_ >= 0) ::close(fd_);
}

std::optional<uint64_t> Pool::Allocate(uint64_t size) {
  if (size == 0) return 0;
  uint64_t need = Rounded(size);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < need) continue;
    uint64_t off = it->first, len = it->second;
    free_.erase(it);
    if (len > need) free_[off + need] = len - need;
    used_ += need;
    return off;
  }
  return std::nullopt;
}

void Pool::Free(uint64_t offset, uint64_t size) {
  if (size == 0) return;
  uint64_t len = Rounded(size);
  used_ -= len;
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && offset + len == next->first) {
    len += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      prev->second += len;
      return;
    }
  }
  free_[offset] = len;
}

uint64_t Pool::largest_free() const {
  uint64_t best = 0;
  for (const auto& [off, len] : free_) best = std::max(best, len);
  return best;
}

uint64_t ParseSize(const std::string& text, const std::string& what) {
  auto bad = [&]() -> uint64_t {
    Throw(ErrorKind::kInvalidInput, what + ": '" + text + "' is not a size (expected e.g. 4096, 512MiB, 2GiB)");
  };
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  if (i == 0) return bad();
  double v;
  try {
    v = std::stod(text.substr(0, i));
  } catch (...) {
    return bad();
  }
  std::string unit = text.substr(i);
  for (auto& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double mult = 1;
  if (unit.empty() || unit == "b") mult = 1;
  else if (unit == "k" || unit == "kib" || unit == "kb") mult = 1024.0;
  else if (unit == "m" || unit == "mib" || unit == "mb") mult = 1024.0 * 1024;
  else if (unit == "g" || unit == "gib" || unit == "gb") mult = 1024.0 * 1024 * 1024;
  else if (unit == "t" || unit == "tib" || unit == "tb") mult = 1024.0 * 1024 * 1024 * 1024;
  else return bad();
  double bytes = v * mult;
  if (!std::isfinite(bytes) || bytes < 0 || bytes > 1e18) return bad();
  return static_cast<uint64_t>(bytes);
}

}  // namespace msaflow::nam
