#include "common/checksum.h"

#include <immintrin.h>
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

namespace {

// glibc's memcpy picks `rep movsb` for pieces of this size, which runs at half speed on some
// AMD cores when source and destination differ in alignment within a page (a mapped pool
// region vs. a heap buffer). Plain 32-byte vector moves do not care.
__attribute__((target("avx2"))) void CopyAvx2(char* d, const char* s, size_t n) {
  size_t i = 0;
  for (; i + 128 <= n; i += 128) {
    __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
    __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 32));
    __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 64));
    __m256i e = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 96));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), a);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i + 32), b);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i + 64), c);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i + 96), e);
  }
  std::memcpy(d + i, s + i, n - i);
}

const bool kHaveAvx2 = __builtin_cpu_supports("avx2");

}  // namespace

void CopyAndHash(void* dst, const void* src, size_t len, Hasher& hasher) {
  constexpr size_t kPiece = 128 << 10;  // fits L2 with room to spare
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  for (size_t off = 0; off < len; off += kPiece) {
    size_t n = len - off < kPiece ? len - off : kPiece;
    if (kHaveAvx2) {
      CopyAvx2(d + off, s + off, n);
    } else {
      std::memcpy(d + off, s + off, n);
    }
    hasher.Update(d + off, n);
  }
}
}  // namespace msaflow
