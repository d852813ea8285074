// LM head and cross-entropy, fused and chunked over tokens so the [T, V] logits never exist at once.
#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/check.hpp"
#include "cpu/cpu_ops.hpp"

namespace mxt {

namespace {
constexpr int64_t kChunk = 64;
constexpr int32_t kIgnore = -100;
}  // namespace

void CpuOps::lm_head_loss(const Tensor& h, const Tensor& W, const Tensor& labels, float grad_scale,
                          const Tensor& loss_sum, const Tensor& dh, const Tensor& dW, const Tensor& dlogits) {
  const char* op = "lm_head_loss";
  const int64_t T = labels.numel(), V = W.ndim ? W.shape[0] : 0;
  const int64_t d = V ? W.numel() / V : 0;
  if (V < 1) cpu::fail(op, "W must be [V, d], got " + W.shape_str());
  cpu::expect_2d(h, T, d, op, "h");
  cpu::expect_numel(loss_sum, 1, op, "loss_sum");
  const bool grad = dh.numel() != 0, keep = dlogits.numel() != 0;
  if (keep && !grad) cpu::fail(op, "dlogits without dh: the logits' gradient is only made with the backward");
  if (grad) {
    cpu::expect_2d(dh, T, d, op, "dh");
    if (keep) cpu::expect_2d(dlogits, T, V, op, "dlogits");
    else cpu::expect_2d(dW, V, d, op, "dW");
  }
  const float* hp = cpu::f32(h, op, "h");
  const float* wp = cpu::f32(W, op, "W");
  const int32_t* lab = cpu::i32(labels, op, "labels");
  float* ls = cpu::f32(loss_sum, op, "loss_sum");
  float* dhp = grad ? cpu::f32(dh, op, "dh") : nullptr;
  float* dwp = grad && !keep ? cpu::f32(dW, op, "dW") : nullptr;
  float* keep_p = keep ? cpu::f32(dlogits, op, "dlogits") : nullptr;
  for (int64_t t = 0; t < T; ++t)
    if (lab[t] != kIgnore && (lab[t] < 0 || lab[t] >= V))
      cpu::fail(op, "labels[" + std::to_string(t) + "] = " + std::to_string(lab[t]) + " outside vocab " +
                        std::to_string(V) + " (and not -100)");

  std::vector<float> logits(keep ? 0 : static_cast<size_t>(std::min(T, kChunk) * V));
  double total = 0.0;
  for (int64_t t0 = 0; t0 < T; t0 += kChunk) {
    const int64_t n = std::min(kChunk, T - t0);
    float* zc = keep ? keep_p + t0 * V : logits.data();  // kept: the chunk's rows of dlogits
    cpu::sgemm(false, true, n, V, d, 1.f, hp + t0 * d, d, wp, d, 0.f, zc, V, op);
    // Each row of the chunk becomes its own loss gradient in place: grad_scale * (softmax - onehot).
    for (int64_t r = 0; r < n; ++r) {
      float* z = zc + r * V;
      const int32_t y = lab[t0 + r];
      if (y == kIgnore) {
        std::fill(z, z + V, 0.f);
        continue;
      }
      const float m = *std::max_element(z, z + V);
      double sum = 0.0;
      for (int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(z[v]) - m);
      const double lse = m + std::log(sum);
      total += lse - z[y];
      for (int64_t v = 0; v < V; ++v) z[v] = static_cast<float>(grad_scale * std::exp(z[v] - lse));
      z[y] -= grad_scale;
    }
    if (!grad) continue;
    cpu::sgemm(false, false, n, d, V, 1.f, zc, V, wp, d, 0.f, dhp + t0 * d, d, op);
    if (!keep) cpu::sgemm(true, false, V, d, n, 1.f, zc, V, hp + t0 * d, d, 1.f, dwp, d, op);
  }
  ls[0] = static_cast<float>(ls[0] + total);
}

}  // namespace mxt
