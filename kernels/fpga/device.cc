#include "kernels/fpga/device.h"

#include "common/error.h"

namespace msaflow::kernels::fpga {

const char* BackendName(Backend b) {
  switch (b) {
    case Backend::kCpu: return "cpu";
    case Backend::kOpenCl: return "opencl";
    case Backend::kAuto: return "auto";
  }
  return "?";
}

std::optional<Backend> BackendFromName(std::string_view name) {
  for (Backend b : {Backend::kCpu, Backend::kOpenCl, Backend::kAuto})
    if (name == BackendName(b)) return b;
  return std::nullopt;
}

std::unique_ptr<Device> Open(const Config& config, std::string* notice) {
  switch (config.backend) {
    case Backend::kCpu: return OpenCpu();
    case Backend::kOpenCl: return OpenOpenCl(config);
    case Backend::kAuto: break;
  }
  // Only a missing platform or device falls back; an OpenCL that is there but fails (a kernel
  // that does not build, a bad board binary) is an error, not a silent change of device.
  const std::string why = OpenClMissing(config);
  if (why.empty()) return OpenOpenCl(config);
  if (notice) *notice = "fpga auto: no OpenCL device, so the CPU backend (" + why.substr(why.find(": ") + 2) + ")";
  return OpenCpu();
}

void PrepareImages(Device& fpga, const ImageSet& ds, int64_t lo, int64_t s, int64_t n, const InputSpec& in, float* out) {
  const int64_t per = in.channels * in.height * in.width;
  for (int64_t i = s - lo, end = s - lo + n; i < end;) {
    int64_t j = ds.uniform() ? end : i + 1;
    while (j < end && ds.Rows(j) == ds.Rows(i) && ds.Cols(j) == ds.Cols(i) && ds.Channels(j) == ds.Channels(i)) ++j;
    fpga.Prepare({ds.Image(i), j - i, ds.Rows(i), ds.Cols(i), ds.Channels(i)}, in, out + (i - (s - lo)) * per);
    i = j;
  }
}

}  // namespace msaflow::kernels::fpga
