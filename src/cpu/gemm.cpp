// Dense GEMM through OpenBLAS (row-major).
#include <cblas.h>

#include <climits>
#include <cstring>

#include "cpu/check.hpp"
#include "cpu/cpu_ops.hpp"

namespace mxt {

namespace cpu {

static blasint blas_int(int64_t v, const char* op) {
  if (v < 0 || v > INT_MAX) fail(op, "GEMM dimension " + std::to_string(v) + " out of BLAS int range");
  return static_cast<blasint>(v);
}

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc, const char* op) {
  if (M == 0 || N == 0) return;
  if (K == 0) {  // op(A) op(B) is all zeros: C = beta C (beta 0 must clear NaN garbage, not multiply it)
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == 0.f ? 0.f : beta * C[i * ldc + j];
    return;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              blas_int(M, op), blas_int(N, op), blas_int(K, op), alpha, A, blas_int(lda, op), B,
              blas_int(ldb, op), beta, C, blas_int(ldc, op));
}

}  // namespace cpu

void CpuOps::gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const Tensor& A,
                  const Tensor& B, float beta, const Tensor& C) {
  const char* op = "gemm";
  if (M < 0 || N < 0 || K < 0) cpu::fail(op, "negative size");
  cpu::expect_numel(A, M * K, op, "A");
  cpu::expect_numel(B, K * N, op, "B");
  cpu::expect_numel(C, M * N, op, "C");
  const float* a = cpu::f32(A, op, "A");
  const float* b = cpu::f32(B, op, "B");
  float* c = cpu::f32(C, op, "C");
  cpu::sgemm(trans_a, trans_b, M, N, K, alpha, a, trans_a ? M : K, b, trans_b ? K : N, beta, c, N, op);
}

}  // namespace mxt
