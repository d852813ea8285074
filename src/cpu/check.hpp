#pragma once
// Argument checks shared by the CPU ops: every failure names the op and the offending argument.
#include <cstdint>
#include <string>

#include "mxtrain/tensor.hpp"

namespace mxt::cpu {

[[noreturn]] void fail(const char* op, const std::string& msg);

// Typed host pointer; throws unless t is a CPU tensor of that dtype with data behind any elements.
float* f32(const Tensor& t, const char* op, const char* arg);
uint16_t* bf16(const Tensor& t, const char* op, const char* arg);  // the raw bits
int32_t* i32(const Tensor& t, const char* op, const char* arg);

// t must have `rows` leading rows and rows*cols elements in all (trailing dims may be split or merged,
// e.g. [T,H,D] and [T,H*D] both pass for rows=T, cols=H*D).
void expect_2d(const Tensor& t, int64_t rows, int64_t cols, const char* op, const char* arg);
void expect_numel(const Tensor& t, int64_t n, const char* op, const char* arg);

// Validates expert offsets [E+1] (0 first, non-decreasing, last <= rows) and returns the host pointer.
const int32_t* expert_offsets(const Tensor& offsets, int64_t E, int64_t rows, const char* op);

// Row-major C = alpha op(A) op(B) + beta C through cblas_sgemm, with the degenerate sizes (M, N or K = 0)
// handled here because BLAS implementations disagree on them. Defined in gemm.cpp.
void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc, const char* op);

}  // namespace mxt::cpu
