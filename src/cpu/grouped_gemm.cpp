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

}  // namespace

void CpuOps::grouped_gemm(const Tensor& x, const Tensor& W, const Tensor& offsets, const Tensor& y) {
  const char* op = "grouped_gemm";
  const int64_t R = x.ndim ? x.shape[0] : 0;
  const Groups g = check_groups(W, offsets, R, op);
  cpu::expect_2d(x, R, g.in, op, "x");
  cpu::expect_2d(y, R, g.out, op, "y");
  const float* xp = cpu::f32(x, op, "x");
  const float* wp = cpu::f32(W, op, "W");
  float* yp = cpu::f32(y, op, "y");
  for (int64_t e = 0; e < g.E; ++e) {
    const int64_t r0 = g.off[e], n = g.off[e + 1] - r0;
    cpu::sgemm(false, true, n, g.out, g.in, 1.f, xp + r0 * g.in, g.in, wp + e * g.out * g.in, g.in, 0.f,
               yp + r0 * g.out, g.out, op);
  }
  zero_tail(yp, g, R, g.out);
}

void CpuOps::grouped_gemm_dgrad(const Tensor& dy, const Tensor& W, const Tensor& offsets, const Tensor& dx) {
  const char* op = "grouped_gemm_dgrad";
  const int64_t R = dy.ndim ? dy.shape[0] : 0;
  const Groups g = check_groups(W, offsets, R, op);
  cpu::expect_2d(dy, R, g.out, op, "dy");
  cpu::expect_2d(dx, R, g.in, op, "dx");
  const float* gp = cpu::f32(dy, op, "dy");
  const float* wp = cpu::f32(W, op, "W");
  float* dxp = cpu::f32(dx, op, "dx");
  for (int64_t e = 0; e < g.E; ++e) {
    const int64_t r0 = g.off[e], n = g.off[e + 1] - r0;
    cpu::sgemm(false, false, n, g.in, g.out, 1.f, gp + r0 * g.out, g.out, wp + e * g.out * g.in, g.in, 0.f,
               dxp + r0 * g.in, g.in, op);
  }
  zero_tail(dxp, g, R, g.in);
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
