// AdamW with torch.optim.AdamW semantics: decoupled weight decay, bias-corrected moments.
#include <cmath>

#include "cpu/check.hpp"
#include "cpu/cpu_ops.hpp"

namespace mxt {

void CpuOps::adamw_step(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                        const AdamWStep& s) {
  const char* op = "adamw_step";
  const int64_t n = param.numel();
  cpu::expect_numel(grad, n, op, "grad");
  cpu::expect_numel(m, n, op, "m");
  cpu::expect_numel(v, n, op, "v");
  if (s.step < 1) cpu::fail(op, "step is 1-based, got " + std::to_string(s.step));
  float* p = cpu::f32(param, op, "param");
  const float* g = cpu::f32(grad, op, "grad");
  float* mp = cpu::f32(m, op, "m");
  float* vp = cpu::f32(v, op, "v");
  // Scalars in double, as torch computes them in Python; per-element math in fp32 like torch.
  const double bc1 = 1.0 - std::pow(static_cast<double>(s.beta1), static_cast<double>(s.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(s.beta2), static_cast<double>(s.step));
  const float step_size = static_cast<float>(s.lr / bc1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const float decay = static_cast<float>(1.0 - static_cast<double>(s.lr) * s.weight_decay);
  const float b1 = s.beta1, b2 = s.beta2;
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] * s.grad_scale;
    mp[i] = b1 * mp[i] + (1.f - b1) * gi;
    vp[i] = b2 * vp[i] + (1.f - b2) * gi * gi;
    p[i] = p[i] * decay - step_size * mp[i] / (std::sqrt(vp[i]) / bc2_sqrt + s.eps);
  }
}

}  // namespace mxt
