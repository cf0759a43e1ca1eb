// What the FPGA steps would take on the target board, from its figures in the machine file
// (Target: clock, lanes, memory bandwidth). A roofline: the larger of the compute time (one
// result per lane per clock) and the memory time (bytes in and out over the bandwidth). It is a
// model, reported as "modelled" beside the time measured here, never instead of it.
#pragma once

#include <cstdint>

#include "kernels/fpga/device.h"

namespace msaflow::kernels::fpga {

struct Modelled {
  double compute_s = 0, memory_s = 0;
  double seconds() const { return compute_s > memory_s ? compute_s : memory_s; }
  const char* bound() const { return compute_s >= memory_s ? "compute" : "memory"; }
};

// Preparing `images` images of rows x cols x in_channels bytes into out_channels x height x
// width values of value_bytes each: one output pixel (all its channels) per lane per clock.
Modelled ModelPrepare(const Target& t, int64_t images, int64_t rows, int64_t cols, int64_t in_channels,
                      int64_t height, int64_t width, int64_t out_channels, int64_t value_bytes);
// Ordering n candidates (select.cl): n * n comparisons, n 8-byte keys in and 4-byte places out.
Modelled ModelSelect(const Target& t, int64_t n);

}  // namespace msaflow::kernels::fpga
