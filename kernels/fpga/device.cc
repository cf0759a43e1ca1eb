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

}  // namespace msaflow::kernels::fpga
