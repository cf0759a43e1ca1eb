// Single-precision matrix products for the heads, on oneDNN's sgemm (row-major, threaded with
// the process's OpenMP threads; results repeat bit for bit for the same shapes and threads).
#pragma once

#include <cstdint>

namespace msaflow::kernels {

// C[m x n] = alpha * op(A) * op(B) + beta * C, row-major: op(A) is m x k (A is k x m when
// trans_a), op(B) is k x n (B is n x k when trans_b); lda, ldb, ldc are the row strides.
void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// bias[m] += the column sums of g[n x m] (row stride ldg), rows in order.
void AddColumnSums(const float* g, int64_t n, int64_t m, int64_t ldg, float* bias);

}  // namespace msaflow::kernels
