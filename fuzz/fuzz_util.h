// What every libFuzzer target shares: an input is either handled or refused with one
// msaflow::Error (the clear error a user would see). Any other exception escaping, a crash, a
// hang or a sanitizer report is a finding; scripts/fuzz.sh runs the targets.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "common/error.h"

namespace msaflow::fuzz {

// Runs `f`; a msaflow::Error is the expected refusal, anything else aborts with its message.
template <typename F>
void Expect(F&& f) {
  try {
    f();
  } catch (const Error&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz: an exception other than msaflow::Error escaped: %s\n", e.what());
    std::abort();
  }
}

inline std::string Text(const uint8_t* data, size_t size) { return std::string(reinterpret_cast<const char*>(data), size); }

}  // namespace msaflow::fuzz
