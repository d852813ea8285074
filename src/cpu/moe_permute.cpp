// Grouping of (token, slot) pairs by expert and the gathers / scatters between token and expert order.
#include <cstring>
#include <vector>

#include "cpu/check.hpp"
#include "cpu/cpu_ops.hpp"

namespace mxt {

// A stable counting sort of the T*k slots by expert, so slots ascend within each expert.
void CpuOps::moe_plan(const Tensor& topk_idx, int num_experts, const Tensor& offsets, const Tensor& perm) {
  const char* op = "moe_plan";
  const int64_t n = topk_idx.numel(), E = num_experts;
  if (E < 1) cpu::fail(op, "num_experts must be positive");
  cpu::expect_numel(offsets, E + 1, op, "offsets");
  cpu::expect_numel(perm, n, op, "perm");
  const int32_t* ix = cpu::i32(topk_idx, op, "topk_idx");
  int32_t* off = cpu::i32(offsets, op, "offsets");
  int32_t* pm = cpu::i32(perm, op, "perm");
  std::vector<int64_t> next(static_cast<size_t>(E) + 1, 0);
  for (int64_t i = 0; i < n; ++i) {
    if (ix[i] < 0 || ix[i] >= E)
      cpu::fail(op, "topk_idx[" + std::to_string(i) + "] = " + std::to_string(ix[i]) + " outside " +
                        std::to_string(E) + " experts");
    ++next[ix[i] + 1];
  }
  for (int64_t e = 0; e < E; ++e) next[e + 1] += next[e];
  for (int64_t e = 0; e <= E; ++e) off[e] = static_cast<int32_t>(next[e]);
  for (int64_t i = 0; i < n; ++i) pm[next[ix[i]]++] = static_cast<int32_t>(i);
}

// A bad slot index would read or write out of bounds, so every entry is checked.
static void check_perm(const int32_t* pm, int64_t n, int64_t limit, const char* op) {
  for (int64_t p = 0; p < n; ++p)
    if (pm[p] < 0 || pm[p] >= limit)
      cpu::fail(op, "perm[" + std::to_string(p) + "] = " + std::to_string(pm[p]) + " outside [0, " +
                        std::to_string(limit) + ")");
}

void CpuOps::moe_permute(const Tensor& x, const Tensor& perm, int k, const Tensor& xp) {
  const char* op = "moe_permute";
  const int64_t T = x.ndim ? x.shape[0] : 0, n = perm.numel();
  if (k < 1 || T * k != n) cpu::fail(op, "perm has " + std::to_string(n) + " entries, x " + x.shape_str());
  const int64_t d = T ? x.numel() / T : 0;
  cpu::expect_2d(xp, n, d, op, "xp");
  const float* xs = cpu::f32(x, op, "x");
  const int32_t* pm = cpu::i32(perm, op, "perm");
  float* o = cpu::f32(xp, op, "xp");
  check_perm(pm, n, n, op);
  for (int64_t p = 0; p < n; ++p) std::memcpy(o + p * d, xs + (pm[p] / k) * d, sizeof(float) * d);
}

void CpuOps::moe_unpermute(const Tensor& yp, const Tensor& perm, int k, const Tensor& out) {
  const char* op = "moe_unpermute";
  const int64_t T = out.ndim ? out.shape[0] : 0, n = perm.numel();
  if (k < 1 || T * k != n) cpu::fail(op, "perm has " + std::to_string(n) + " entries, out " + out.shape_str());
  const int64_t d = T ? out.numel() / T : 0;
  cpu::expect_2d(yp, n, d, op, "yp");
  const float* ys = cpu::f32(yp, op, "yp");
  const int32_t* pm = cpu::i32(perm, op, "perm");
  float* o = cpu::f32(out, op, "out");
  check_perm(pm, n, n, op);
  if (n) std::memset(o, 0, out.bytes());
  for (int64_t p = 0; p < n; ++p) {
    float* row = o + (pm[p] / k) * d;
    const float* src = ys + p * d;
    for (int64_t j = 0; j < d; ++j) row[j] += src[j];
  }
}

void CpuOps::moe_permute_weights(const Tensor& w, const Tensor& perm, const Tensor& wp) {
  const char* op = "moe_permute_weights";
  const int64_t n = perm.numel();
  cpu::expect_numel(w, n, op, "w");
  cpu::expect_numel(wp, n, op, "wp");
  const float* ws = cpu::f32(w, op, "w");
  const int32_t* pm = cpu::i32(perm, op, "perm");
  float* o = cpu::f32(wp, op, "wp");
  check_perm(pm, n, n, op);
  for (int64_t p = 0; p < n; ++p) o[p] = ws[pm[p]];
}

void CpuOps::moe_unpermute_weights(const Tensor& dwp, const Tensor& perm, const Tensor& dw) {
  const char* op = "moe_unpermute_weights";
  const int64_t n = perm.numel();
  cpu::expect_numel(dwp, n, op, "dwp");
  cpu::expect_numel(dw, n, op, "dw");
  const float* g = cpu::f32(dwp, op, "dwp");
  const int32_t* pm = cpu::i32(perm, op, "perm");
  float* o = cpu::f32(dw, op, "dw");
  check_perm(pm, n, n, op);
  if (n) std::memset(o, 0, dw.bytes());  // perm is a permutation, but never leave stale values if it is not
  for (int64_t p = 0; p < n; ++p) o[pm[p]] = g[p];
}

}  // namespace mxt
