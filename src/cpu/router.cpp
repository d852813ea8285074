// MoE router: softmax over experts, top-k, renormalised weights; plus the load-balancing statistics.
#include <cmath>
#include <vector>

#include "cpu/check.hpp"
#include "cpu/cpu_ops.hpp"

namespace mxt {

void CpuOps::router_forward(const Tensor& logits, int k, const Tensor& probs, const Tensor& topk_idx,
                            const Tensor& topk_w) {
  const char* op = "router_forward";
  const int64_t T = logits.ndim ? logits.shape[0] : 0, E = T ? logits.numel() / T : logits.dim(-1);
  if (k < 1 || k > E) cpu::fail(op, "k = " + std::to_string(k) + " with " + std::to_string(E) + " experts");
  cpu::expect_2d(logits, T, E, op, "logits");
  cpu::expect_2d(probs, T, E, op, "probs");
  cpu::expect_2d(topk_idx, T, k, op, "topk_idx");
  cpu::expect_2d(topk_w, T, k, op, "topk_w");
  const float* lg = cpu::f32(logits, op, "logits");
  float* pr = cpu::f32(probs, op, "probs");
  int32_t* ix = cpu::i32(topk_idx, op, "topk_idx");
  float* tw = cpu::f32(topk_w, op, "topk_w");
  std::vector<char> taken(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    const float* l = lg + t * E;
    float* p = pr + t * E;
    float m = l[0];
    for (int64_t e = 1; e < E; ++e) m = std::max(m, l[e]);
    double sum = 0.0;
    for (int64_t e = 0; e < E; ++e) sum += std::exp(static_cast<double>(l[e] - m));
    for (int64_t e = 0; e < E; ++e) p[e] = static_cast<float>(std::exp(static_cast<double>(l[e] - m)) / sum);
    // Repeated arg-max; the strict '>' keeps the lower index on ties.
    std::fill(taken.begin(), taken.end(), 0);
    double wsum = 0.0;
    for (int j = 0; j < k; ++j) {
      int64_t best = -1;
      for (int64_t e = 0; e < E; ++e)
        if (!taken[e] && (best < 0 || p[e] > p[best])) best = e;
      taken[best] = 1;
      ix[t * k + j] = static_cast<int32_t>(best);
      wsum += p[best];
    }
    for (int j = 0; j < k; ++j) tw[t * k + j] = static_cast<float>(p[ix[t * k + j]] / wsum);
  }
}

// w_i = p_i / S (S = sum of the top-k probs), so dp_i = (g_i - sum_j g_j w_j) / S inside the top-k set;
// then the softmax backward dlogit = p * (dp - sum(p * dp)).
void CpuOps::router_backward(const Tensor& dtopk_w, const Tensor& probs, const Tensor& topk_idx,
                             const Tensor& topk_w, const Tensor& dprobs_extra, const Tensor& dlogits) {
  const char* op = "router_backward";
  const int64_t T = probs.ndim ? probs.shape[0] : 0, E = T ? probs.numel() / T : probs.dim(-1);
  const int64_t k = T ? topk_idx.numel() / T : topk_idx.dim(-1);
  cpu::expect_2d(dtopk_w, T, k, op, "dtopk_w");
  cpu::expect_2d(topk_idx, T, k, op, "topk_idx");
  cpu::expect_2d(topk_w, T, k, op, "topk_w");
  cpu::expect_2d(dlogits, T, E, op, "dlogits");
  const bool extra = dprobs_extra.numel() != 0;
  if (extra) cpu::expect_2d(dprobs_extra, T, E, op, "dprobs_extra");
  const float* g = cpu::f32(dtopk_w, op, "dtopk_w");
  const float* pr = cpu::f32(probs, op, "probs");
  const int32_t* ix = cpu::i32(topk_idx, op, "topk_idx");
  const float* tw = cpu::f32(topk_w, op, "topk_w");
  const float* ex = extra ? cpu::f32(dprobs_extra, op, "dprobs_extra") : nullptr;
  float* dl = cpu::f32(dlogits, op, "dlogits");
  std::vector<double> dp(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    const float* p = pr + t * E;
    double S = 0.0, gw = 0.0;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = ix[t * k + j];
      if (e < 0 || e >= E) cpu::fail(op, "topk_idx out of range: " + std::to_string(e));
      S += p[e];
      gw += static_cast<double>(g[t * k + j]) * tw[t * k + j];
    }
    for (int64_t e = 0; e < E; ++e) dp[e] = extra ? ex[t * E + e] : 0.0;
    for (int64_t j = 0; j < k; ++j) dp[ix[t * k + j]] += (g[t * k + j] - gw) / S;
    double pdp = 0.0;
    for (int64_t e = 0; e < E; ++e) pdp += p[e] * dp[e];
    for (int64_t e = 0; e < E; ++e) dl[t * E + e] = static_cast<float>(p[e] * (dp[e] - pdp));
  }
}

void CpuOps::router_aux_stats(const Tensor& probs, const Tensor& topk_idx, const Tensor& prob_sum,
                              const Tensor& count) {
  const char* op = "router_aux_stats";
  const int64_t E = prob_sum.numel(), T = probs.ndim ? probs.shape[0] : 0;
  cpu::expect_2d(probs, T, E, op, "probs");
  cpu::expect_numel(count, E, op, "count");
  const float* pr = cpu::f32(probs, op, "probs");
  const int32_t* ix = cpu::i32(topk_idx, op, "topk_idx");
  float* ps = cpu::f32(prob_sum, op, "prob_sum");
  float* cn = cpu::f32(count, op, "count");
  std::vector<double> acc(static_cast<size_t>(E), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t e = 0; e < E; ++e) acc[e] += pr[t * E + e];
  for (int64_t e = 0; e < E; ++e) ps[e] += static_cast<float>(acc[e]);
  for (int64_t i = 0, n = topk_idx.numel(); i < n; ++i) {
    if (ix[i] < 0 || ix[i] >= E) cpu::fail(op, "topk_idx out of range: " + std::to_string(ix[i]));
    cn[ix[i]] += 1.f;
  }
}

void CpuOps::broadcast_rows(const Tensor& coef, const Tensor& dprobs) {
  const char* op = "broadcast_rows";
  const int64_t E = coef.numel(), T = dprobs.ndim ? dprobs.shape[0] : 0;
  cpu::expect_2d(dprobs, T, E, op, "dprobs");
  const float* c = cpu::f32(coef, op, "coef");
  float* d = cpu::f32(dprobs, op, "dprobs");
  for (int64_t t = 0; t < T; ++t)
    for (int64_t e = 0; e < E; ++e) d[t * E + e] = c[e];
}

}  // namespace mxt
