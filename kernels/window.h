// The output size and padding of a sliding window along one spatial axis, as ONNX's Conv and
// pooling operators define them (auto_pad, ceil_mode): shared by the inference executor and
// the trainable tail, so that both compute the same shapes.
#pragma once

#include <cstdint>
#include <string>

namespace msaflow::kernels {

// Output size and (begin, end) padding of one spatial axis of `in` elements for a window of
// `k` taps, stride `s`, dilation `d` and given pads `pb`, `pe` (ignored for SAME_* and VALID).
// ceil_mode (pooling): the last window may hang over the end, as long as it starts inside the
// input or its begin padding; the overhang becomes end padding. *out = 0 where nothing fits.
void SpatialOut(const std::string& auto_pad, int64_t in, int64_t k, int64_t s, int64_t d, int64_t pb, int64_t pe,
                int64_t* out, int64_t* pad_b, int64_t* pad_e, bool ceil_mode = false);

}  // namespace msaflow::kernels
