// The journal reader (`msaflow status`, record/status.h PrintStatus) on an arbitrary
// journal.jsonl, with or without a results.json beside it (the input's first byte decides).
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/files.h"
#include "fuzz/fuzz_util.h"
#include "record/status.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  static const std::string dir = [] {
    std::string d = "/tmp/msaflow-fuzz-journal-" + std::to_string(::getpid());
    msaflow::MakeDirs(d);
    return d;
  }();
  static std::FILE* sink = std::fopen("/dev/null", "w");
  // Odd first byte: the rest is journal.jsonl, a NUL, then results.json.
  std::string journal = msaflow::fuzz::Text(data + 1, size - 1), results;
  const size_t nul = journal.find('\0');
  if ((data[0] & 1) && nul != std::string::npos) {
    results = journal.substr(nul + 1);
    journal.resize(nul);
  }
  std::ofstream(dir + "/journal.jsonl", std::ios::binary | std::ios::trunc) << journal;  // no fsync: fast
  std::error_code ec;
  std::filesystem::remove(dir + "/results.json", ec);
  if (data[0] & 1) std::ofstream(dir + "/results.json", std::ios::binary | std::ios::trunc) << results;
  msaflow::fuzz::Expect([&] { msaflow::record::PrintStatus(dir, sink); });
  return 0;
}
