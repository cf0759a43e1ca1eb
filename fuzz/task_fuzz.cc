// The task-file reader (workflow/task.h): what `msaflow module STEP --task F` reads.
#include <nlohmann/json.hpp>

#include "fuzz/fuzz_util.h"
#include "workflow/task.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nlohmann::json body = nlohmann::json::parse(data, data + size, nullptr, false);
  if (body.is_discarded()) return 0;  // not JSON: the module refuses it before ParseTask
  msaflow::fuzz::Expect([&] { msaflow::workflow::ParseTask(body, "fuzz-task.json"); });
  return 0;
}
