// Image and array decoding for datasets: PNG and JPEG (kernels/image_codec.h, libpng and
// libjpeg-turbo behind it) and the .npy reader (kernels/npy.h). The input's first byte picks
// the reader; the rest is the file.
#include <unistd.h>

#include <fstream>
#include <string>

#include "common/files.h"
#include "fuzz/fuzz_util.h"
#include "kernels/image_codec.h"
#include "kernels/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string body = msaflow::fuzz::Text(data + 1, size - 1);
  if (data[0] % 2 == 0) {
    msaflow::fuzz::Expect([&] {
      auto d = msaflow::kernels::DecodeImage(body, "fuzz.img");
      if (d.pixels.size() != static_cast<size_t>(d.rows * d.cols * d.channels)) __builtin_trap();
    });
    return 0;
  }
  static const std::string dir = [] {
    std::string d = "/tmp/msaflow-fuzz-npy-" + std::to_string(::getpid());
    msaflow::MakeDirs(d);
    return d;
  }();
  // The same bytes as images and as labels: both readers see every input.
  std::ofstream(dir + "/x.npy", std::ios::binary | std::ios::trunc) << body;
  std::ofstream(dir + "/y.npy", std::ios::binary | std::ios::trunc) << body;
  msaflow::fuzz::Expect([&] {
    msaflow::kernels::ParseNpyHeader(body, "fuzz.npy");
    auto s = msaflow::kernels::ReadNpy(dir + "/x.npy", dir + "/y.npy", data[0] % 5);
    s.Digest();
  });
  return 0;
}
