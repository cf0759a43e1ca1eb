// The FPGA's two jobs in the workflow, behind one interface: preparing images for a backbone
// (step 2) and ordering a round's candidates (step 5). Backends: "opencl" runs
// kernels/fpga/prepare.cl and select.cl on an OpenCL device (PoCL's CPU device here, which is
// the simulated FPGA; an FPGA board's runtime on the DAM, with a binary built offline), "cpu"
// runs the same arithmetic in C++ (kernels/prepare.h). docs/fpga.md.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/dataset.h"
#include "kernels/prepare.h"

namespace msaflow::kernels::fpga {

// The target FPGA's figures, for the cost model (cost_model.h); zero = not given.
struct Target {
  std::string name;         // e.g. "Stratix 10 GX 2800 (DEEP-EST DAM)"
  double clock_mhz = 0;     // kernel clock
  double lanes = 0;         // output pixels (prepare) or comparisons (select) per clock
  double memory_gbs = 0;    // global memory bandwidth, GB/s
  bool given() const { return clock_mhz > 0 && lanes > 0 && memory_gbs > 0; }
};

// Where the FPGA's kernels run: C++ on the CPU, an OpenCL device, or OpenCL when a platform is
// present and else the CPU. Parsed from machine and pipeline files in workflow/fpga_config.cc.
enum class Backend { kCpu, kOpenCl, kAuto };
const char* BackendName(Backend b);  // "cpu", "opencl", "auto"
std::optional<Backend> BackendFromName(std::string_view name);
inline void to_json(nlohmann::json& j, Backend b) { j = BackendName(b); }  // by name; parsed in workflow/

struct Config {
  Backend backend = Backend::kCpu;
  std::string platform;         // opencl: a platform whose name or vendor contains this (any case); "" = the first
  std::string binary;           // opencl: a program built offline for the board; "" = compile the OpenCL C source
  std::string source;           // opencl: OpenCL C replacing the built-in kernels (a site's tuned copy); "" = built in
  Target target;
};

class Device {
 public:
  virtual ~Device() = default;
  // "cpu (C++)" or "opencl: <platform> / <device>".
  virtual std::string Name() const = 0;
  virtual std::string Backend() const = 0;  // "cpu" | "opencl"
  // kernels/prepare.h's PrepareBatch and PrepareBatchInt8 on this device.
  virtual void Prepare(const ImageBatch& in, const InputSpec& spec, float* out) = 0;
  virtual void PrepareInt8(const ImageBatch& in, const InputSpec& spec, int8_t* out) = 0;
  // The positions 0..n-1 ordered by key, largest first, equal keys by position: a permutation.
  virtual std::vector<uint32_t> Order(const std::vector<uint64_t>& keys) = 0;
};

// Prepares images [s, s + n) of `ds` (whose first image is row `lo`) into `out` (n prepared
// images, in.channels x in.height x in.width floats each): one Prepare call per run of images of
// the same size and channels (all of them, but for an image folder). What prepare runs per batch,
// load's int8 calibration on its sample, and rank on its subset.
void PrepareImages(Device& fpga, const ImageSet& ds, int64_t lo, int64_t s, int64_t n, const InputSpec& in, float* out);

std::unique_ptr<Device> OpenCpu();
// Throws kUnsupported (exit 6) when no OpenCL platform/device matches, naming what was found,
// and when the kernels do not build (with the build log).
std::unique_ptr<Device> OpenOpenCl(const Config& config);
// Why OpenOpenCl would find no platform or device for `config`, or "" when it would.
std::string OpenClMissing(const Config& config);
// Opens config.backend; "auto" is OpenCL when a platform is present, else the CPU, and then
// `*notice` says why (one line).
std::unique_ptr<Device> Open(const Config& config, std::string* notice);

}  // namespace msaflow::kernels::fpga
