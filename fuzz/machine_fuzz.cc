// The machine-file parser (workflow/machine.h) on arbitrary bytes.
#include "fuzz/fuzz_util.h"
#include "workflow/machine.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  msaflow::fuzz::Expect([&] {
    msaflow::workflow::ParseMachine(msaflow::fuzz::Text(data, size), "fuzz-machine.json", "/nonexistent-fuzz-base");
  });
  return 0;
}
