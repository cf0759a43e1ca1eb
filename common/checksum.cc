#include "common/checksum.h"

#include <xxhash.h>

#include <cstdio>

namespace msaflow {

uint64_t Checksum64(std::string_view bytes) { return XXH3_64bits(bytes.data(), bytes.size()); }

std::string Hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string ChecksumHex(std::string_view bytes) { return Hex64(Checksum64(bytes)); }

}  // namespace msaflow
