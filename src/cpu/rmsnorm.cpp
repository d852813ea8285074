// RMSNorm (HF Mixtral): y = x * rsqrt(mean(x^2) + eps) * w, statistics in fp32 (double here, the oracle).
#include <cmath>
#include <vector>

#include "cpu/check.hpp"
#include "cpu/cpu_ops.hpp"

namespace mxt {

void CpuOps::rmsnorm_forward(const Tensor& x, const Tensor& w, float eps, const Tensor& y,
                             const Tensor& rstd) {
  const char* op = "rmsnorm_forward";
  const int64_t d = w.numel(), T = x.ndim ? x.shape[0] : 0;
  cpu::expect_2d(x, T, d, op, "x");
  cpu::expect_2d(y, T, d, op, "y");
  cpu::expect_numel(rstd, T, op, "rstd");
  const float* xp = cpu::f32(x, op, "x");
  const float* wp = cpu::f32(w, op, "w");
  float* yp = cpu::f32(y, op, "y");
  float* rp = cpu::f32(rstd, op, "rstd");
  for (int64_t t = 0; t < T; ++t) {
    const float* xr = xp + t * d;
    double ss = 0.0;
    for (int64_t j = 0; j < d; ++j) ss += static_cast<double>(xr[j]) * xr[j];
    const float r = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(d) + eps));
    rp[t] = r;
    // Same rounding order as HF: normalise first, then scale by the weight.
    for (int64_t j = 0; j < d; ++j) yp[t * d + j] = wp[j] * (xr[j] * r);
  }
}

// With g = w*dy and r = rstd: dx = r*g - r^3/d * x * sum(g*x); dw += sum_t dy * x * r.
void CpuOps::rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                              const Tensor& dx, const Tensor& dw) {
  const char* op = "rmsnorm_backward";
  const int64_t d = w.numel(), T = x.ndim ? x.shape[0] : 0;
  cpu::expect_2d(x, T, d, op, "x");
  cpu::expect_2d(dy, T, d, op, "dy");
  cpu::expect_2d(dx, T, d, op, "dx");
  cpu::expect_numel(rstd, T, op, "rstd");
  cpu::expect_numel(dw, d, op, "dw");
  const float* g = cpu::f32(dy, op, "dy");
  const float* xp = cpu::f32(x, op, "x");
  const float* wp = cpu::f32(w, op, "w");
  const float* rp = cpu::f32(rstd, op, "rstd");
  float* dxp = cpu::f32(dx, op, "dx");
  float* dwp = cpu::f32(dw, op, "dw");
  std::vector<double> dw_acc(static_cast<size_t>(d), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    const float* xr = xp + t * d;
    const float* gr = g + t * d;
    const double r = rp[t];
    double dot = 0.0;
    for (int64_t j = 0; j < d; ++j) dot += static_cast<double>(wp[j]) * gr[j] * xr[j];
    const double c = r * r * r * dot / static_cast<double>(d);
    for (int64_t j = 0; j < d; ++j) {
      dxp[t * d + j] = static_cast<float>(r * wp[j] * gr[j] - c * xr[j]);
      dw_acc[j] += static_cast<double>(gr[j]) * xr[j] * r;
    }
  }
  for (int64_t j = 0; j < d; ++j) dwp[j] += static_cast<float>(dw_acc[j]);
}

}  // namespace mxt
