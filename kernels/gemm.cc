#include "kernels/gemm.h"

#include <oneapi/dnnl/dnnl.h>

#include <cstring>
#include <string>

#include "common/error.h"

namespace msaflow::kernels {

void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {  // an empty sum: C = beta * C (sgemm refuses k = 0)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.f ? 0.f : beta * c[i * ldc + j];
    return;
  }
  dnnl_status_t s = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  if (s != dnnl_success)
    Throw(ErrorKind::kInternal, "sgemm " + std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) +
                                    " failed (oneDNN status " + std::to_string(static_cast<int>(s)) + ")");
}

void AddColumnSums(const float* g, int64_t n, int64_t m, int64_t ldg, float* bias) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) bias[j] += g[i * ldg + j];
}

}  // namespace msaflow::kernels
