#include "common/checksum.h"

#include <xxhash.h>

#include <cstdio>
#include <cstring>
#include <new>

namespace msaflow {

uint64_t Checksum64(std::string_view bytes) { return XXH3_64bits(bytes.data(), bytes.size()); }

std::string Hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string ChecksumHex(std::string_view bytes) { return Hex64(Checksum64(bytes)); }

Hasher::Hasher() : state_(XXH3_createState()) {
  if (!state_) throw std::bad_alloc();
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}
Hasher::~Hasher() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }
void Hasher::Update(const void* data, size_t len) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data, len);
}
uint64_t Hasher::Digest() const { return XXH3_64bits_digest(static_cast<XXH3_state_t*>(state_)); }

void CopyAndHash(void* dst, const void* src, size_t len, Hasher& hasher) {
  constexpr size_t kPiece = 128 << 10;  // fits L2 with room to spare
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  for (size_t off = 0; off < len; off += kPiece) {
    size_t n = len - off < kPiece ? len - off : kPiece;
    std::memcpy(d + off, s + off, n);
    hasher.Update(d + off, n);
  }
}

}  // namespace msaflow
