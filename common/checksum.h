// Content checksums (XXH3-64) used by the NAM objects and content keys.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace msaflow {

uint64_t Checksum64(std::string_view bytes);
// 16 lowercase hex digits.
std::string Hex64(uint64_t v);
std::string ChecksumHex(std::string_view bytes);

// Incremental XXH3-64: Update() over consecutive pieces gives Checksum64 of the whole.
class Hasher {
 public:
  Hasher();
  ~Hasher();
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;
  void Update(const void* data, size_t len);
  uint64_t Digest() const;

 private:
  void* state_;  // XXH3_state_t
};

// memcpy(dst, src, len) fused with hashing the copied bytes (piece by piece, while they are
// in cache): one pass over memory instead of two.
void CopyAndHash(void* dst, const void* src, size_t len, Hasher& hasher);

}  // namespace msaflow
