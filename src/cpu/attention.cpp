// Causal GQA attention, straightforward per-(batch, head, query) loops. The forward keeps only the
// log-sum-exp per query; the backward recomputes probabilities from it (the flash-attention recipe).
// With AttnShape::doc_ids (packed rows), query i also needs doc[j] == doc[i] to see key j: documents packed
// into one row never attend to each other (a block-diagonal causal mask, what varlen attention computes).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "cpu/check.hpp"
#include "cpu/cpu_ops.hpp"

namespace mxt {

namespace {

struct Layout {
  int64_t B, S, H, KVH, D, group;
  // Element offset of token (b, s), head h in a [T, heads, D] tensor.
  int64_t at(int64_t b, int64_t s, int64_t h, int64_t heads) const { return ((b * S + s) * heads + h) * D; }
};

Layout check_layout(const AttnShape& s, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                    const Tensor& lse, const char* op) {
  if (s.batch < 0 || s.seq < 0 || s.n_heads <= 0 || s.n_kv_heads <= 0 || s.head_dim <= 0 ||
      s.n_heads % s.n_kv_heads)
    cpu::fail(op, "bad AttnShape (heads " + std::to_string(s.n_heads) + ", kv heads " +
                      std::to_string(s.n_kv_heads) + ", head_dim " + std::to_string(s.head_dim) + ")");
  const int64_t T = s.batch * s.seq;
  cpu::expect_2d(q, T, s.n_heads * s.head_dim, op, "q");
  cpu::expect_2d(k, T, s.n_kv_heads * s.head_dim, op, "k");
  cpu::expect_2d(v, T, s.n_kv_heads * s.head_dim, op, "v");
  cpu::expect_2d(o, T, s.n_heads * s.head_dim, op, "out");
  cpu::expect_numel(lse, s.batch * s.n_heads * s.seq, op, "lse");
  return {s.batch, s.seq, s.n_heads, s.n_kv_heads, s.head_dim, s.n_heads / s.n_kv_heads};
}

// The document id of every token, or null for plain causal attention.
const int32_t* doc_ids(const AttnShape& s, const char* op) {
  if (!s.doc_ids.data) return nullptr;
  cpu::expect_numel(s.doc_ids, s.batch * s.seq, op, "doc_ids");
  return cpu::i32(s.doc_ids, op, "doc_ids");
}

inline float dot(const float* a, const float* b, int64_t n) {
  float acc = 0.f;
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

}  // namespace

void CpuOps::attention_forward(const AttnShape& s, const Tensor& q, const Tensor& k, const Tensor& v,
                               const Tensor& out, const Tensor& lse) {
  const char* op = "attention_forward";
  const Layout L = check_layout(s, q, k, v, out, lse, op);
  const float* qp = cpu::f32(q, op, "q");
  const float* kp = cpu::f32(k, op, "k");
  const float* vp = cpu::f32(v, op, "v");
  float* op_ = cpu::f32(out, op, "out");
  float* lp = cpu::f32(lse, op, "lse");
  const int32_t* doc = doc_ids(s, op);
  const float scale = 1.0f / std::sqrt(static_cast<float>(L.D));
  std::vector<float> p(static_cast<size_t>(L.S));
  std::vector<double> acc(static_cast<size_t>(L.D));
  for (int64_t b = 0; b < L.B; ++b)
    for (int64_t h = 0; h < L.H; ++h) {
      const int64_t g = h / L.group;
      for (int64_t i = 0; i < L.S; ++i) {
        const float* qi = qp + L.at(b, i, h, L.H);
        auto visible = [&](int64_t j) { return !doc || doc[b * L.S + j] == doc[b * L.S + i]; };
        float m = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j <= i; ++j) {
          if (!visible(j)) continue;
          p[j] = dot(qi, kp + L.at(b, j, g, L.KVH), L.D) * scale;
          m = std::max(m, p[j]);
        }
        double sum = 0.0;
        for (int64_t j = 0; j <= i; ++j) {
          p[j] = visible(j) ? std::exp(p[j] - m) : 0.f;  // key i itself is always visible: m is finite
          sum += p[j];
        }
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t j = 0; j <= i; ++j) {
          if (!visible(j)) continue;
          const float* vj = vp + L.at(b, j, g, L.KVH);
          for (int64_t d = 0; d < L.D; ++d) acc[d] += static_cast<double>(p[j]) * vj[d];
        }
        float* oi = op_ + L.at(b, i, h, L.H);
        for (int64_t d = 0; d < L.D; ++d) oi[d] = static_cast<float>(acc[d] / sum);
        lp[(b * L.H + h) * L.S + i] = m + static_cast<float>(std::log(sum));
      }
    }
}

// With P = softmax(scale * Q K^T): dV = P^T dO; dS = P * (dO V^T - rowsum(dO * O)); dQ = scale dS K;
// dK = scale dS^T Q. Query heads sharing a kv head add into the same dK/dV rows.
void CpuOps::attention_backward(const AttnShape& s, const Tensor& dout, const Tensor& q, const Tensor& k,
                                const Tensor& v, const Tensor& out, const Tensor& lse, const Tensor& dq,
                                const Tensor& dk, const Tensor& dv) {
  const char* op = "attention_backward";
  const Layout L = check_layout(s, q, k, v, out, lse, op);
  cpu::expect_2d(dout, L.B * L.S, L.H * L.D, op, "dout");
  cpu::expect_2d(dq, L.B * L.S, L.H * L.D, op, "dq");
  cpu::expect_2d(dk, L.B * L.S, L.KVH * L.D, op, "dk");
  cpu::expect_2d(dv, L.B * L.S, L.KVH * L.D, op, "dv");
  const float* gp = cpu::f32(dout, op, "dout");
  const float* qp = cpu::f32(q, op, "q");
  const float* kp = cpu::f32(k, op, "k");
  const float* vp = cpu::f32(v, op, "v");
  const float* op_ = cpu::f32(out, op, "out");
  const float* lp = cpu::f32(lse, op, "lse");
  float* dqp = cpu::f32(dq, op, "dq");
  float* dkp = cpu::f32(dk, op, "dk");
  float* dvp = cpu::f32(dv, op, "dv");
  const int32_t* doc = doc_ids(s, op);
  std::memset(dkp, 0, dk.bytes());
  std::memset(dvp, 0, dv.bytes());
  const float scale = 1.0f / std::sqrt(static_cast<float>(L.D));
  for (int64_t b = 0; b < L.B; ++b)
    for (int64_t h = 0; h < L.H; ++h) {
      const int64_t g = h / L.group;
      for (int64_t i = 0; i < L.S; ++i) {
        const float* qi = qp + L.at(b, i, h, L.H);
        const float* gi = gp + L.at(b, i, h, L.H);
        const float Di = dot(gi, op_ + L.at(b, i, h, L.H), L.D);
        const float lse_i = lp[(b * L.H + h) * L.S + i];
        float* dqi = dqp + L.at(b, i, h, L.H);
        std::fill(dqi, dqi + L.D, 0.f);
        for (int64_t j = 0; j <= i; ++j) {
          if (doc && doc[b * L.S + j] != doc[b * L.S + i]) continue;  // masked: p_ij = 0, no gradient
          const float* kj = kp + L.at(b, j, g, L.KVH);
          const float* vj = vp + L.at(b, j, g, L.KVH);
          const float pij = std::exp(dot(qi, kj, L.D) * scale - lse_i);
          const float ds = pij * (dot(gi, vj, L.D) - Di) * scale;
          float* dkj = dkp + L.at(b, j, g, L.KVH);
          float* dvj = dvp + L.at(b, j, g, L.KVH);
          for (int64_t d = 0; d < L.D; ++d) {
            dvj[d] += pij * gi[d];
            dqi[d] += ds * kj[d];
            dkj[d] += ds * qi[d];
          }
        }
      }
    }
}

}  // namespace mxt
