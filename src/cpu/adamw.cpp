// AdamW with torch.optim.AdamW semantics: decoupled weight decay, bias-corrected moments. The moments are F32
// (the recipe's) or BF16 (adamw_moments_dtype): then each is updated in fp32, used unrounded for this step's
// parameter update, and stored rounded to nearest even, as Transformer Engine's FusedAdam does with bf16 moments.
#include <cmath>

#include "cpu/check.hpp"
#include "cpu/cpu_ops.hpp"
#include "mxtrain/bf16.hpp"

namespace mxt {
namespace {

struct F32Moment {
  float* p;
  float get(int64_t i) const { return p[i]; }
  void set(int64_t i, float x) const { p[i] = x; }
};
struct Bf16Moment {
  uint16_t* p;
  float get(int64_t i) const { return bf16_bits_to_f32(p[i]); }
  void set(int64_t i, float x) const { p[i] = f32_to_bf16_bits(x); }
};

template <class M>
void adamw_loop(float* p, const float* g, M m, M v, int64_t n, const AdamWStep& s) {
  // Scalars in double, as torch computes them in Python; per-element math in fp32 like torch.
  const double bc1 = 1.0 - std::pow(static_cast<double>(s.beta1), static_cast<double>(s.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(s.beta2), static_cast<double>(s.step));
  const float step_size = static_cast<float>(s.lr / bc1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const float decay = static_cast<float>(1.0 - static_cast<double>(s.lr) * s.weight_decay);
  const float b1 = s.beta1, b2 = s.beta2;
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] * s.grad_scale;
    const float mi = b1 * m.get(i) + (1.f - b1) * gi;
    const float vi = b2 * v.get(i) + (1.f - b2) * gi * gi;
    m.set(i, mi);
    v.set(i, vi);
    p[i] = p[i] * decay - step_size * mi / (std::sqrt(vi) / bc2_sqrt + s.eps);
  }
}

}  // namespace

void CpuOps::adamw_step(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                        const AdamWStep& s) {
  const char* op = "adamw_step";
  const int64_t n = param.numel();
  cpu::expect_numel(grad, n, op, "grad");
  cpu::expect_numel(m, n, op, "m");
  cpu::expect_numel(v, n, op, "v");
  if (s.step < 1) cpu::fail(op, "step is 1-based, got " + std::to_string(s.step));
  if (m.dtype != v.dtype)
    cpu::fail(op, std::string("m and v differ in dtype: ") + dtype_name(m.dtype) + ", " + dtype_name(v.dtype));
  float* p = cpu::f32(param, op, "param");
  const float* g = cpu::f32(grad, op, "grad");
  if (m.dtype == DType::BF16)
    adamw_loop(p, g, Bf16Moment{cpu::bf16(m, op, "m")}, Bf16Moment{cpu::bf16(v, op, "v")}, n, s);
  else
    adamw_loop(p, g, F32Moment{cpu::f32(m, op, "m")}, F32Moment{cpu::f32(v, op, "v")}, n, s);
}

}  // namespace mxt
