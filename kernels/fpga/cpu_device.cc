// The "cpu" backend: the C++ arithmetic of kernels/prepare.cc and a sort with the same strict
// order as select.cl.
#include <algorithm>
#include <numeric>

#include "kernels/fpga/device.h"

namespace msaflow::kernels::fpga {
namespace {

class CpuDevice final : public Device {
 public:
  std::string Name() const override { return "cpu (C++)"; }
  std::string Backend() const override { return "cpu"; }
  void Prepare(const ImageBatch& in, const InputSpec& spec, float* out) override { PrepareBatch(in, spec, out); }
  void PrepareInt8(const ImageBatch& in, const InputSpec& spec, int8_t* out) override {
    PrepareBatchInt8(in, spec, out);
  }
  std::vector<uint32_t> Order(const std::vector<uint64_t>& keys) override {
    std::vector<uint32_t> order(keys.size());
    std::iota(order.begin(), order.end(), 0u);
    std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return keys[a] != keys[b] ? keys[a] > keys[b] : a < b; });
    return order;
  }
};

}  // namespace

std::unique_ptr<Device> OpenCpu() { return std::make_unique<CpuDevice>(); }

}  // namespace msaflow::kernels::fpga
