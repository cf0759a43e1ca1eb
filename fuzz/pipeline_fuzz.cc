// The pipeline parser and validator (workflow/pipeline.h) on arbitrary bytes. Paths in the
// document resolve under a directory that does not exist, so no file is read.
#include "fuzz/fuzz_util.h"
#include "workflow/candidates.h"
#include "workflow/pipeline.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  msaflow::fuzz::Expect([&] {
    auto p = msaflow::workflow::ParsePipeline(msaflow::fuzz::Text(data, size), "fuzz.json", "/nonexistent-fuzz-base");
    // What a run does next with a valid pipeline: the first round's candidates.
    if (p.rounds.candidates <= 64) msaflow::workflow::FirstRound(p);
  });
  return 0;
}
