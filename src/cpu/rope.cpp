// Rotary position embedding, HF rotate_half convention (pairs i and i + head_dim/2).
#include <cmath>
#include <vector>

#include "cpu/check.hpp"
#include "cpu/cpu_ops.hpp"

namespace mxt {

// sign = +1 rotates by +angle (forward), -1 by -angle (the transpose, for the gradient).
static void rope_apply(const Tensor& x, const Tensor& pos, float theta, float sign, const char* op) {
  if (x.ndim != 3) cpu::fail(op, "x must be [T, n_heads, head_dim], got " + x.shape_str());
  const int64_t T = x.shape[0], H = x.shape[1], D = x.shape[2], half = D / 2;
  if (D % 2) cpu::fail(op, "head_dim must be even, got " + std::to_string(D));
  cpu::expect_numel(pos, T, op, "pos");
  float* xp = cpu::f32(x, op, "x");
  const int32_t* pp = cpu::i32(pos, op, "pos");
  // Frequencies and angles in fp32 as HF computes them (inv_freq = 1 / theta^(2i/D); angle = pos * inv_freq)
  // so that long positions round the same way; cos/sin of that fp32 angle are then exact to fp32.
  std::vector<float> inv_freq(half);
  for (int64_t i = 0; i < half; ++i)
    inv_freq[i] = 1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(D));
  std::vector<float> c(half), s(half);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const float a = static_cast<float>(pp[t]) * inv_freq[i];
      c[i] = static_cast<float>(std::cos(static_cast<double>(a)));
      s[i] = sign * static_cast<float>(std::sin(static_cast<double>(a)));
    }
    for (int64_t h = 0; h < H; ++h) {
      float* r = xp + (t * H + h) * D;
      for (int64_t i = 0; i < half; ++i) {
        const float x1 = r[i], x2 = r[i + half];
        r[i] = x1 * c[i] - x2 * s[i];
        r[i + half] = x2 * c[i] + x1 * s[i];
      }
    }
  }
}

void CpuOps::rope_forward(const Tensor& x, const Tensor& pos, float theta) {
  rope_apply(x, pos, theta, 1.f, "rope_forward");
}

void CpuOps::rope_backward(const Tensor& dx, const Tensor& pos, float theta) {
  rope_apply(dx, pos, theta, -1.f, "rope_backward");
}

}  // namespace mxt
