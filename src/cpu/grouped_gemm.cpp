// Expert GEMMs over rows grouped by expert: one cblas_sgemm per expert on its row range.
#include <cstring>

#include "cpu/check.hpp"
#include "cpu/cpu_ops.hpp"

namespace mxt {

namespace {

struct Groups {
  int64_t E, out, in;
  const int32_t* off;
};

// W / dW is [E, out, in]; rows beyond offsets[E] (unused capacity) are zeroed in overwrite outputs.
Groups check_groups(const Tensor& W, const Tensor& offsets, int64_t rows, const char* op) {
  if (W.ndim != 3) cpu::fail(op, "expert weights must be [E, out, in], got " + W.shape_str());
  Groups g{W.shape[0], W.shape[1], W.shape[2], nullptr};
  g.off = cpu::expert_offsets(offsets, g.E, rows, op);
  return g;
}

void zero_tail(float* p, const Groups& g, int64_t rows, int64_t width) {
  const int64_t used = g.off[g.E];
  if (rows > used) std::memset(p + used * width, 0, sizeof(float) * (rows - used) * width);
}

// C's rows of expert e = A's rows of e times W[e]^T (forward: A = x [R, in], C = y [R, out]) or W[e] (dgrad:
// A = dy [R, out], C = dx [R, in]); C's rows past offsets[E] are zeroed.
void rows_by_expert(const char* op, const Tensor& A, const char* a_name, const Tensor& W, bool transpose_w,
                    const Tensor& offsets, const Tensor& C, const char* c_name) {
  const int64_t R = A.ndim ? A.shape[0] : 0;
  const Groups g = check_groups(W, offsets, R, op);
  const int64_t ka = transpose_w ? g.in : g.out, nc = transpose_w ? g.out : g.in;
  cpu::expect_2d(A, R, ka, op, a_name);
  cpu::expect_2d(C, R, nc, op, c_name);
  const float* ap = cpu::f32(A, op, a_name);
  const float* wp = cpu::f32(W, op, "W");
  float* cp = cpu::f32(C, op, c_name);
  for (int64_t e = 0; e < g.E; ++e) {
    const int64_t r0 = g.off[e], n = g.off[e + 1] - r0;
    cpu::sgemm(false, transpose_w, n, nc, ka, 1.f, ap + r0 * ka, ka, wp + e * g.out * g.in, g.in, 0.f, cp + r0 * nc,
               nc, op);
  }
  zero_tail(cp, g, R, nc);
}

}  // namespace

void CpuOps::grouped_gemm(const Tensor& x, const Tensor& W, const Tensor& offsets, const Tensor& y) {
  rows_by_expert("grouped_gemm", x, "x", W, true, offsets, y, "y");
}

void CpuOps::grouped_gemm_dgrad(const Tensor& dy, const Tensor& W, const Tensor& offsets, const Tensor& dx) {
  rows_by_expert("grouped_gemm_dgrad", dy, "dy", W, false, offsets, dx, "dx");
}

void CpuOps::grouped_gemm_wgrad(const Tensor& dy, const Tensor& x, const Tensor& offsets, const Tensor& dW) {
  const char* op = "grouped_gemm_wgrad";
  const int64_t R = dy.ndim ? dy.shape[0] : 0;
  const Groups g = check_groups(dW, offsets, R, op);
  cpu::expect_2d(dy, R, g.out, op, "dy");
  cpu::expect_2d(x, R, g.in, op, "x");
  const float* gp = cpu::f32(dy, op, "dy");
  const float* xp = cpu::f32(x, op, "x");
  float* dwp = cpu::f32(dW, op, "dW");
  for (int64_t e = 0; e < g.E; ++e) {
    const int64_t r0 = g.off[e], n = g.off[e + 1] - r0;
    if (n == 0) continue;  // nothing to accumulate (and K = 0 would make sgemm rescale by beta)
    cpu::sgemm(true, false, g.out, g.in, n, 1.f, gp + r0 * g.out, g.out, xp + r0 * g.in, g.in, 1.f,
               dwp + e * g.out * g.in, g.in, op);
  }
}

}  // namespace mxt
