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

}  // namespace msaflow
