// The select step's reduction on a device: candidates' metrics -> their order, best first,
// ties by candidate id. Shared by every backend: the checks and the metric -> key encoding.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/fpga/device.h"

namespace msaflow::kernels::fpga {

struct Scored {
  std::string candidate;
  double metric = 0;
};

// A 64-bit key whose unsigned order is the order of the (non-NaN) doubles; -0 and +0 are equal.
uint64_t OrderKey(double metric);

// All candidates, best first: larger metric first, equal metrics by candidate id (smallest
// first). Throws kInvalidInput for no candidates, a NaN metric (naming the candidate) or a
// candidate id given twice.
std::vector<Scored> SelectOrder(Device& device, const std::vector<Scored>& scores);

}  // namespace msaflow::kernels::fpga
