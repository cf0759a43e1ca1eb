#include "kernels/window.h"

#include <algorithm>

namespace msaflow::kernels {

void SpatialOut(const std::string& auto_pad, int64_t in, int64_t k, int64_t s, int64_t d, int64_t pb, int64_t pe,
                int64_t* out, int64_t* pad_b, int64_t* pad_e, bool ceil_mode) {
  int64_t ke = (k - 1) * d + 1;
  if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
    *out = (in + s - 1) / s;
    int64_t total = std::max<int64_t>((*out - 1) * s + ke - in, 0);
    int64_t small = total / 2;
    *pad_b = auto_pad == "SAME_UPPER" ? small : total - small;
    *pad_e = total - *pad_b;
  } else {
    if (auto_pad == "VALID") pb = pe = 0;
    *pad_b = pb;
    *pad_e = pe;
    const int64_t span = in + pb + pe - ke;
    if (span < 0) {
      *out = 0;
    } else if (!ceil_mode) {
      *out = span / s + 1;
    } else {
      *out = (span + s - 1) / s + 1;
      if ((*out - 1) * s >= in + pb) --*out;
      *pad_e = std::max(pe, (*out - 1) * s + ke - in - pb);
    }
  }
}

}  // namespace msaflow::kernels
