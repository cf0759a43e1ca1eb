#include <cstring>

#include "parallel/train.h"

namespace msaflow::parallel {

void TrainData::Row(int64_t row, int64_t dim, float* out) const {
  const float* in = x + row * dim;
  if (!mean) {
    std::memcpy(out, in, static_cast<size_t>(dim) * sizeof(float));
    return;
  }
  kernels::StandardizeRow(in, mean, inv_std, dim, out);
}

void TrainData::Rows(int64_t lo, int64_t hi, int64_t dim, float* out) const {
  for (int64_t i = lo; i < hi; ++i) Row(i, dim, out + (i - lo) * dim);
}

}  // namespace msaflow::parallel
