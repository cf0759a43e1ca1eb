// Images made ready for a backbone on the step's FPGA backend (resize, channels, normalisation):
// what prepare runs per batch and load's int8 calibration runs on its sample (internal to modules/).
#pragma once

#include <cstdint>

#include "kernels/dataset.h"
#include "kernels/fpga/device.h"

namespace msaflow::modules {

// Prepares images [s, s + n) of `ds` (whose first image is row `lo`) into `out` (n prepared
// images, in.channels x in.height x in.width floats each): one backend call per run of images
// of the same size and channels (all of them, but for an image folder).
void PrepareImages(kernels::fpga::Device& fpga, const kernels::ImageSet& ds, int64_t lo, int64_t s, int64_t n,
                   const kernels::InputSpec& in, float* out);

}  // namespace msaflow::modules
