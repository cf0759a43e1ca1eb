// The NAM server's memory: one pool of `capacity` bytes in a memfd (so a client on the same
// node can map it), carved into regions by a first-fit allocator that coalesces free
// neighbours. Pages stay with the pool once touched (a reused region costs no page faults),
// so the server's resident memory is the high-water mark of its use, at most `capacity`.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace msaflow::nam {

class Pool {
 public:
  static constexpr uint64_t kAlign = 64;  // regions start on cache lines

  explicit Pool(uint64_t capacity);  // throws kIo / kInvalidInput
  ~Pool();
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  // A region of at least `size` bytes (size 0 takes no space), or nothing if no free extent
  // is large enough.
  std::optional<uint64_t> Allocate(uint64_t size);
  void Free(uint64_t offset, uint64_t size);

  char* base() const { return base_; }
  int fd() const { return fd_; }
  uint64_t capacity() const { return capacity_; }
  uint64_t used() const { return used_; }
  uint64_t largest_free() const;
  static uint64_t Rounded(uint64_t size) { return (size + kAlign - 1) / kAlign * kAlign; }

 private:
  uint64_t capacity_;
  uint64_t used_ = 0;
  int fd_ = -1;
  char* base_ = nullptr;
  std::map<uint64_t, uint64_t> free_;  // offset -> length
};

// "512MiB", "2GiB", "1g", "4096" -> bytes. Throws kInvalidInput naming `what`.
uint64_t ParseSize(const std::string& text, const std::string& what);

}  // namespace msaflow::nam
