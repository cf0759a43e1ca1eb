#include "modules/prepare_images.h"

namespace msaflow::modules {

void PrepareImages(kernels::fpga::Device& fpga, const kernels::ImageSet& ds, int64_t lo, int64_t s, int64_t n,
                   const kernels::InputSpec& in, float* out) {
  const int64_t per = in.channels * in.height * in.width;
  for (int64_t i = s - lo, end = s - lo + n; i < end;) {
    int64_t j = ds.uniform() ? end : i + 1;
    while (j < end && ds.Rows(j) == ds.Rows(i) && ds.Cols(j) == ds.Cols(i) && ds.Channels(j) == ds.Channels(i)) ++j;
    fpga.Prepare({ds.Image(i), j - i, ds.Rows(i), ds.Cols(i), ds.Channels(i)}, in, out + (i - (s - lo)) * per);
    i = j;
  }
}

}  // namespace msaflow::modules
