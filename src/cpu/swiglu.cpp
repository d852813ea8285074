// SwiGLU fused with the routing weight: a = silu(gate) * up * wp (the weight is applied before the down
// projection; by linearity this equals HF's weighting of the expert output).
#include <cmath>

#include "cpu/check.hpp"
#include "cpu/cpu_ops.hpp"

namespace mxt {

namespace {
inline float sigmoid(float x) { return 1.f / (1.f + std::exp(-x)); }
}  // namespace

void CpuOps::swiglu_forward(const Tensor& h13, const Tensor& wp, const Tensor& a) {
  const char* op = "swiglu_forward";
  const int64_t R = wp.numel(), f = R ? a.numel() / R : (a.ndim ? a.dim(-1) : 0);
  cpu::expect_2d(a, R, f, op, "a");
  cpu::expect_2d(h13, R, 2 * f, op, "h13");
  const float* h = cpu::f32(h13, op, "h13");
  const float* w = cpu::f32(wp, op, "wp");
  float* o = cpu::f32(a, op, "a");
  for (int64_t r = 0; r < R; ++r) {
    const float* gate = h + r * 2 * f;
    const float* up = gate + f;
    for (int64_t i = 0; i < f; ++i) o[r * f + i] = gate[i] * sigmoid(gate[i]) * up[i] * w[r];
  }
}

// silu'(g) = s (1 + g (1 - s)) with s = sigmoid(g).
void CpuOps::swiglu_backward(const Tensor& da, const Tensor& h13, const Tensor& wp, const Tensor& dh13,
                             const Tensor& dwp) {
  const char* op = "swiglu_backward";
  const int64_t R = wp.numel(), f = R ? da.numel() / R : (da.ndim ? da.dim(-1) : 0);
  cpu::expect_2d(da, R, f, op, "da");
  cpu::expect_2d(h13, R, 2 * f, op, "h13");
  cpu::expect_2d(dh13, R, 2 * f, op, "dh13");
  cpu::expect_numel(dwp, R, op, "dwp");
  const float* g = cpu::f32(da, op, "da");
  const float* h = cpu::f32(h13, op, "h13");
  const float* w = cpu::f32(wp, op, "wp");
  float* dh = cpu::f32(dh13, op, "dh13");
  float* dw = cpu::f32(dwp, op, "dwp");
  for (int64_t r = 0; r < R; ++r) {
    const float* gate = h + r * 2 * f;
    const float* up = gate + f;
    const float* gr = g + r * f;
    float* dgate = dh + r * 2 * f;
    float* dup = dgate + f;
    double acc = 0.0;
    for (int64_t i = 0; i < f; ++i) {
      const float s = sigmoid(gate[i]), silu = gate[i] * s;
      acc += static_cast<double>(gr[i]) * silu * up[i];
      dgate[i] = gr[i] * w[r] * up[i] * s * (1.f + gate[i] * (1.f - s));
      dup[i] = gr[i] * w[r] * silu;
    }
    dw[r] = static_cast<float>(acc);
  }
}

}  // namespace mxt
