// The IDX dataset reader (kernels/dataset.h): the input's first byte splits the rest into an
// images file and a labels file (plain or gzip, as read from disk), with a limit.
#include <unistd.h>

#include <fstream>
#include <string>

#include "common/files.h"
#include "fuzz/fuzz_util.h"
#include "kernels/dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  static const std::string dir = [] {
    std::string d = "/tmp/msaflow-fuzz-idx-" + std::to_string(::getpid());
    msaflow::MakeDirs(d);
    return d;
  }();
  const size_t rest = size - 1, split = rest * data[0] / 255;
  const std::string all = msaflow::fuzz::Text(data + 1, rest);
  // Plain writes (no fsync): thousands of inputs a second.
  std::ofstream(dir + "/images", std::ios::binary | std::ios::trunc) << all.substr(0, split);
  std::ofstream(dir + "/labels", std::ios::binary | std::ios::trunc) << all.substr(split);
  const int64_t limit = data[0] % 3 == 0 ? 0 : data[0] % 7;
  msaflow::fuzz::Expect([&] {
    auto ds = msaflow::kernels::ReadIdx(dir + "/images", dir + "/labels", limit);
    ds.Digest();
    ds.classes();
  });
  return 0;
}
