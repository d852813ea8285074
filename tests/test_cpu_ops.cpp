// Forward checks of the CPU backend against hand-computed values and naive, independent loops.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cpu/cpu_ops.hpp"
#include "host_test_util.hpp"
#include "mxtrain/bf16.hpp"

using mxt::DType;
using mxt::Tensor;

namespace {

using mxt::testing::FVec;
using mxt::testing::IVec;

using mxt::testing::F;
using mxt::testing::I;
using mxt::testing::uniform;

class CpuOpsTest : public ::testing::Test {
 protected:
  std::unique_ptr<mxt::Ops> ops = mxt::make_cpu_ops();
  std::mt19937 rng{1234};
};

using mxt::testing::invalid_argument_message;

}  // namespace

// ---- memory and elementwise ---------------------------------------------------------------------------

TEST_F(CpuOpsTest, AllocIsZeroFilledAlignedAndRoundTrips) {
  EXPECT_EQ(ops->device(), mxt::Device::CPU);
  EXPECT_STREQ(ops->name(), "cpu");
  const size_t n = 1001;
  auto* p = static_cast<float*>(ops->alloc(n * sizeof(float)));
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(p[i], 0.f) << i;
  FVec src = uniform(n, rng), back(n);
  ops->upload(p, src.data(), n * sizeof(float));
  ops->download(back.data(), p, n * sizeof(float));
  EXPECT_EQ(src, back);
  ops->synchronize();
  ops->release(p);
  void* z = ops->alloc(0);
  EXPECT_NE(z, nullptr);
  ops->release(z);
}

TEST_F(CpuOpsTest, ElementwiseOps) {
  FVec a = uniform(10, rng), b = uniform(10, rng), out(10), a0 = a;
  ops->add(F(a, {10}), F(b, {2, 5}), F(out, {10}));
  for (int i = 0; i < 10; ++i) EXPECT_EQ(out[i], a[i] + b[i]);
  ops->mul(F(a, {10}), F(b, {10}), F(a, {10}));  // out aliases a
  for (int i = 0; i < 10; ++i) EXPECT_EQ(a[i], a0[i] * b[i]);
  FVec c = b;
  ops->scale(F(c, {10}), -2.5f);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(c[i], -2.5f * b[i]);
  FVec acc = {1.5f};
  double ss = 0;
  for (float x : b) ss += double(x) * x;
  ops->sum_squares(F(b, {10}), F(acc, {1}));
  EXPECT_NEAR(acc[0], 1.5 + ss, 1e-6);
  FVec d(10);
  ops->copy(F(b, {10}), F(d, {5, 2}));
  EXPECT_EQ(d, b);
  ops->zero(F(d, {10}));
  for (float x : d) EXPECT_EQ(x, 0.f);
  EXPECT_THROW(ops->add(F(a, {10}), F(b, {10}), F(out, {9})), std::invalid_argument);
  EXPECT_THROW(ops->copy(F(a, {10}), F(out, {9})), std::invalid_argument);
}

TEST_F(CpuOpsTest, CopyConvertsBetweenF32AndBF16) {
  FVec src = {1.0f, 3.140625f, -2.0f, 1.0f + 1.0f / 256.f, 1.0f + 3.0f / 256.f}, back(5);
  std::vector<uint16_t> h(5);
  Tensor hb(h.data(), DType::BF16, {5});
  ops->copy(F(src, {5}), hb);
  EXPECT_EQ(h[0], 0x3F80);
  ops->copy(hb, F(back, {5}));
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_EQ(back[1], 3.140625f);  // exactly representable in bf16
  EXPECT_EQ(back[2], -2.0f);
  EXPECT_EQ(back[3], 1.0f);                 // halfway: rounds to even (down)
  EXPECT_EQ(back[4], 1.0f + 4.0f / 256.f);  // halfway: rounds to even (up)
  IVec iv(5);
  EXPECT_THROW(ops->copy(F(src, {5}), I(iv, {5})), std::invalid_argument);
}

TEST_F(CpuOpsTest, WrongDtypeOrShapeThrowsWithOpName) {
  FVec a(8), b(8);
  Tensor bf(b.data(), DType::BF16, {8});
  std::string m = invalid_argument_message([&] { ops->add(F(a, {8}), bf, F(a, {8})); });
  EXPECT_NE(m.find("add"), std::string::npos) << m;
  EXPECT_NE(m.find("bf16"), std::string::npos) << m;
  FVec x(12, 1.f), w(4, 1.f), y(8), rstd(3);
  m = invalid_argument_message([&] { ops->rmsnorm_forward(F(x, {3, 4}), F(w, {4}), 1e-5f, F(y, {2, 4}), F(rstd, {3})); });
  EXPECT_NE(m.find("rmsnorm_forward"), std::string::npos) << m;
  EXPECT_NE(m.find("[2, 4]"), std::string::npos) << m;
  FVec cuda_like(4);
  Tensor dev(cuda_like.data(), DType::F32, {4}, mxt::Device::CUDA);
  EXPECT_THROW(ops->scale(dev, 2.f), std::invalid_argument);
}

// ---- GEMM ---------------------------------------------------------------------------------------------

TEST_F(CpuOpsTest, GemmAllTransposesMatchNaive) {
  const int64_t M = 5, N = 7, K = 3;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      FVec A = uniform(M * K, rng), B = uniform(K * N, rng), C = uniform(M * N, rng), C0 = C;
      ops->gemm(ta, tb, M, N, K, 0.7f, F(A, {ta ? K : M, ta ? M : K}), F(B, {tb ? N : K, tb ? K : N}), 0.3f,
                F(C, {M, N}));
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
          double s = 0;
          for (int64_t p = 0; p < K; ++p)
            s += double(ta ? A[p * M + i] : A[i * K + p]) * (tb ? B[j * K + p] : B[p * N + j]);
          EXPECT_NEAR(C[i * N + j], 0.7 * s + 0.3 * C0[i * N + j], 1e-5) << ta << tb << " " << i << "," << j;
        }
    }
}

TEST_F(CpuOpsTest, GemmBetaZeroOverwritesAndDegenerateSizes) {
  FVec A = uniform(6, rng), B = uniform(6, rng), C(4, std::numeric_limits<float>::quiet_NaN());
  ops->gemm(false, false, 2, 2, 3, 1.f, F(A, {2, 3}), F(B, {3, 2}), 0.f, F(C, {2, 2}));
  for (float c : C) EXPECT_FALSE(std::isnan(c));
  FVec C2 = {1.f, 2.f, 3.f, 4.f};
  ops->gemm(false, false, 2, 2, 0, 1.f, Tensor(nullptr, DType::F32, {2, 0}), Tensor(nullptr, DType::F32, {0, 2}),
            0.5f, F(C2, {2, 2}));
  EXPECT_EQ(C2, (FVec{0.5f, 1.f, 1.5f, 2.f}));
  ops->gemm(false, false, 0, 2, 3, 1.f, Tensor(nullptr, DType::F32, {0, 3}), F(B, {3, 2}), 0.f,
            Tensor(nullptr, DType::F32, {0, 2}));
  EXPECT_THROW(ops->gemm(false, false, 2, 2, 2, 1.f, F(A, {2, 3}), F(B, {3, 2}), 0.f, F(C, {2, 2})),
               std::invalid_argument);
}

// ---- embedding, RMSNorm, RoPE -------------------------------------------------------------------------

TEST_F(CpuOpsTest, EmbeddingGathersAndScatterAdds) {
  const int64_t V = 6, d = 3;
  FVec table = uniform(V * d, rng), out(4 * d);
  IVec ids = {4, 0, 4, 5};
  ops->embedding_forward(I(ids, {4}), F(table, {V, d}), F(out, {4, d}));
  for (int t = 0; t < 4; ++t)
    for (int j = 0; j < d; ++j) EXPECT_EQ(out[t * d + j], table[ids[t] * d + j]);
  FVec dout = uniform(4 * d, rng), dtab(V * d, 1.f);
  ops->embedding_backward(I(ids, {4}), F(dout, {4, d}), F(dtab, {V, d}));
  for (int j = 0; j < d; ++j) {
    EXPECT_FLOAT_EQ(dtab[4 * d + j], 1.f + dout[0 * d + j] + dout[2 * d + j]);
    EXPECT_FLOAT_EQ(dtab[0 * d + j], 1.f + dout[1 * d + j]);
    EXPECT_FLOAT_EQ(dtab[5 * d + j], 1.f + dout[3 * d + j]);
    EXPECT_EQ(dtab[1 * d + j], 1.f);
  }
  IVec bad = {6};
  EXPECT_THROW(ops->embedding_forward(I(bad, {1}), F(table, {V, d}), F(out, {1, d})), std::invalid_argument);
}

TEST_F(CpuOpsTest, RmsNormMatchesNaive) {
  const int64_t T = 5, d = 16;
  const float eps = 1e-5f;
  FVec x = uniform(T * d, rng, -3.f, 3.f), w = uniform(d, rng, 0.5f, 1.5f), y(T * d), rstd(T);
  ops->rmsnorm_forward(F(x, {T, d}), F(w, {d}), eps, F(y, {T, d}), F(rstd, {T}));
  for (int64_t t = 0; t < T; ++t) {
    double ms = 0;
    for (int64_t j = 0; j < d; ++j) ms += double(x[t * d + j]) * x[t * d + j] / d;
    const double r = 1.0 / std::sqrt(ms + eps);
    EXPECT_NEAR(rstd[t], r, 1e-6 * r);
    for (int64_t j = 0; j < d; ++j) EXPECT_NEAR(y[t * d + j], x[t * d + j] * r * w[j], 1e-5);
  }
}

TEST_F(CpuOpsTest, RopeKnownValues) {
  // head_dim 4, theta 1e4: inverse frequencies {1, 0.01}; pairs are (0, 2) and (1, 3).
  FVec x = {1.f, 2.f, 3.f, 4.f, 1.f, 2.f, 3.f, 4.f, -1.f, 0.5f, 2.f, -3.f};
  IVec pos = {0, 1, 7};
  FVec x0 = x;
  ops->rope_forward(F(x, {3, 1, 4}), I(pos, {3}), 10000.f);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(x[i], x0[i]);  // position 0 is the identity
  const double c1 = std::cos(1.0), s1 = std::sin(1.0), c2 = std::cos(0.01), s2 = std::sin(0.01);
  EXPECT_NEAR(x[4], 1 * c1 - 3 * s1, 1e-6);
  EXPECT_NEAR(x[6], 3 * c1 + 1 * s1, 1e-6);
  EXPECT_NEAR(x[5], 2 * c2 - 4 * s2, 1e-6);
  EXPECT_NEAR(x[7], 4 * c2 + 2 * s2, 1e-6);
  EXPECT_NEAR(x[8], -1 * std::cos(7.0) - 2 * std::sin(7.0), 1e-6);
  EXPECT_NEAR(x[10], 2 * std::cos(7.0) + -1 * std::sin(7.0), 1e-6);
  EXPECT_NEAR(x[9], 0.5 * std::cos(0.07) - (-3) * std::sin(0.07), 1e-6);
  EXPECT_NEAR(x[11], -3 * std::cos(0.07) + 0.5 * std::sin(0.07), 1e-6);
}

TEST_F(CpuOpsTest, RopeMatchesFormulaAndBackwardInverts) {
  const int64_t T = 6, H = 3, D = 16;
  const float theta = 1e6f;
  FVec x = uniform(T * H * D, rng), x0 = x;
  IVec pos = {0, 5, 17, 100, 255, 3};
  ops->rope_forward(F(x, {T, H, D}), I(pos, {T}), theta);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < D / 2; ++i) {
        const double a = pos[t] * std::pow(double(theta), -2.0 * i / D);
        const float* r0 = &x0[(t * H + h) * D];
        const float* r = &x[(t * H + h) * D];
        EXPECT_NEAR(r[i], r0[i] * std::cos(a) - r0[i + D / 2] * std::sin(a), 2e-5);
        EXPECT_NEAR(r[i + D / 2], r0[i + D / 2] * std::cos(a) + r0[i] * std::sin(a), 2e-5);
      }
  ops->rope_backward(F(x, {T, H, D}), I(pos, {T}), theta);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(x[i], x0[i], 1e-6);
}

// ---- attention ----------------------------------------------------------------------------------------

namespace {

// Naive reference: expand K/V with HF's repeat_kv (kv head g serves query heads g*rep .. g*rep+rep-1),
// build the full masked score matrix and softmax it in double.
void naive_attention(const mxt::AttnShape& s, const FVec& q, const FVec& k, const FVec& v, std::vector<double>& out,
                     std::vector<double>& lse) {
  const int64_t B = s.batch, S = s.seq, H = s.n_heads, KVH = s.n_kv_heads, D = s.head_dim, rep = H / KVH;
  std::vector<double> kr(B * S * H * D), vr(B * S * H * D);
  for (int64_t t = 0; t < B * S; ++t)
    for (int64_t g = 0; g < KVH; ++g)
      for (int64_t r = 0; r < rep; ++r)
        for (int64_t d = 0; d < D; ++d) {
          kr[(t * H + g * rep + r) * D + d] = k[(t * KVH + g) * D + d];
          vr[(t * H + g * rep + r) * D + d] = v[(t * KVH + g) * D + d];
        }
  out.assign(B * S * H * D, 0.0);
  lse.assign(B * H * S, 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      std::vector<double> sc(S * S, -std::numeric_limits<double>::infinity());
      for (int64_t i = 0; i < S; ++i)
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += double(q[((b * S + i) * H + h) * D + d]) * kr[((b * S + j) * H + h) * D + d];
          sc[i * S + j] = dot / std::sqrt(double(D));
        }
      for (int64_t i = 0; i < S; ++i) {
        double z = 0;
        for (int64_t j = 0; j < S; ++j) z += std::exp(sc[i * S + j]);
        lse[(b * H + h) * S + i] = std::log(z);
        for (int64_t j = 0; j < S; ++j)
          for (int64_t d = 0; d < D; ++d)
            out[((b * S + i) * H + h) * D + d] += std::exp(sc[i * S + j]) / z * vr[((b * S + j) * H + h) * D + d];
      }
    }
}

}  // namespace

TEST_F(CpuOpsTest, AttentionMatchesNaiveGqa) {
  mxt::AttnShape s{2, 7, 4, 2, 8};
  const int64_t T = s.batch * s.seq;
  FVec q = uniform(T * 4 * 8, rng, -2.f, 2.f), k = uniform(T * 2 * 8, rng, -2.f, 2.f), v = uniform(T * 2 * 8, rng);
  FVec out(T * 4 * 8), lse(2 * 4 * 7);
  ops->attention_forward(s, F(q, {T, 4, 8}), F(k, {T, 2, 8}), F(v, {T, 2, 8}), F(out, {T, 4, 8}), F(lse, {2, 4, 7}));
  std::vector<double> ro, rl;
  naive_attention(s, q, k, v, ro, rl);
  for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], ro[i], 2e-5) << i;
  for (size_t i = 0; i < lse.size(); ++i) ASSERT_NEAR(lse[i], rl[i], 2e-5) << i;
  // The first query of each sequence sees only itself.
  for (int d = 0; d < 8; ++d) EXPECT_FLOAT_EQ(out[(1 * 7 * 4 + 3) * 8 + d], v[(1 * 7 * 2 + 1) * 8 + d]);
}

TEST_F(CpuOpsTest, AttentionSeq128IsFast) {
  mxt::AttnShape s{1, 128, 4, 2, 64};
  const int64_t T = 128;
  FVec q = uniform(T * 4 * 64, rng), k = uniform(T * 2 * 64, rng), v = uniform(T * 2 * 64, rng);
  FVec out(q.size()), lse(4 * 128), dout = uniform(q.size(), rng), dq(q.size()), dk(k.size()), dv(v.size());
  const auto t0 = std::chrono::steady_clock::now();
  ops->attention_forward(s, F(q, {T, 4, 64}), F(k, {T, 2, 64}), F(v, {T, 2, 64}), F(out, {T, 4, 64}), F(lse, {1, 4, 128}));
  const auto t1 = std::chrono::steady_clock::now();
  ops->attention_backward(s, F(dout, {T, 4, 64}), F(q, {T, 4, 64}), F(k, {T, 2, 64}), F(v, {T, 2, 64}),
                          F(out, {T, 4, 64}), F(lse, {1, 4, 128}), F(dq, {T, 4, 64}), F(dk, {T, 2, 64}),
                          F(dv, {T, 2, 64}));
  const auto t2 = std::chrono::steady_clock::now();
  const double fwd_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
  const double bwd_ms = std::chrono::duration<double, std::milli>(t2 - t1).count();
  std::printf("attention seq 128, 4 heads, d 64: forward %.2f ms, backward %.2f ms\n", fwd_ms, bwd_ms);
  EXPECT_LT(fwd_ms + bwd_ms, 100.0);  // generous: a few ms expected, catches an accidental O(S^3)
}

// ---- router -------------------------------------------------------------------------------------------

TEST_F(CpuOpsTest, RouterTopkHandMade) {
  const float l2 = std::log(2.f), l4 = std::log(4.f);
  // Row 0: probs 1:2:2:4 -> expert 3, then the tie 1/2 goes to the lower index 1.
  // Row 1: all equal -> experts 0, 1.  Row 2: plain ordering.
  FVec logits = {0.f, l2, l2, l4, 1.f, 1.f, 1.f, 1.f, 3.f, -1.f, 2.f, 0.5f};
  FVec probs(12), w(6);
  IVec idx(6);
  ops->router_forward(F(logits, {3, 4}), 2, F(probs, {3, 4}), I(idx, {3, 2}), F(w, {3, 2}));
  EXPECT_EQ(idx, (IVec{3, 1, 0, 1, 0, 2}));
  EXPECT_NEAR(probs[0], 1.0 / 9, 1e-6);
  EXPECT_NEAR(probs[3], 4.0 / 9, 1e-6);
  EXPECT_NEAR(probs[5], 0.25, 1e-6);
  EXPECT_NEAR(w[0], 4.0 / 6, 1e-6);
  EXPECT_NEAR(w[1], 2.0 / 6, 1e-6);
  EXPECT_NEAR(w[2], 0.5, 1e-6);
  EXPECT_NEAR(w[4], std::exp(3.0) / (std::exp(3.0) + std::exp(2.0)), 1e-6);
  const double z = std::exp(3.0) + std::exp(-1.0) + std::exp(2.0) + std::exp(0.5);
  EXPECT_NEAR(probs[9], std::exp(-1.0) / z, 1e-6);
  // Large logits must not overflow (max subtraction).
  FVec big = {1000.f, 999.f, 0.f, -1000.f}, bp(4), bw(1);
  IVec bi(1);
  ops->router_forward(F(big, {1, 4}), 1, F(bp, {1, 4}), I(bi, {1, 1}), F(bw, {1, 1}));
  EXPECT_EQ(bi[0], 0);
  EXPECT_NEAR(bp[0], 1.0 / (1.0 + std::exp(-1.0)), 1e-6);
  EXPECT_EQ(bw[0], 1.f);
  EXPECT_THROW(ops->router_forward(F(big, {1, 4}), 5, F(bp, {1, 4}), I(bi, {1, 1}), F(bw, {1, 1})),
               std::invalid_argument);
}

TEST_F(CpuOpsTest, RouterAuxStatsAndBroadcastRows) {
  FVec probs = {0.1f, 0.2f, 0.7f, 0.5f, 0.25f, 0.25f}, psum = {1.f, 1.f, 1.f}, cnt = {0.f, 2.f, 0.f};
  IVec idx = {2, 1, 0, 1};
  ops->router_aux_stats(F(probs, {2, 3}), I(idx, {2, 2}), F(psum, {3}), F(cnt, {3}));
  EXPECT_NEAR(psum[0], 1.6f, 1e-6);
  EXPECT_NEAR(psum[1], 1.45f, 1e-6);
  EXPECT_NEAR(psum[2], 1.95f, 1e-6);
  EXPECT_EQ(cnt, (FVec{1.f, 4.f, 1.f}));
  FVec coef = {0.5f, -1.f, 2.f}, d(9, 7.f);
  ops->broadcast_rows(F(coef, {3}), F(d, {3, 3}));
  for (int t = 0; t < 3; ++t)
    for (int e = 0; e < 3; ++e) EXPECT_EQ(d[t * 3 + e], coef[e]);
}

// ---- MoE permutation ----------------------------------------------------------------------------------

TEST_F(CpuOpsTest, MoePlanHandMade) {
  // Slots t*k+j: 0:e2 1:e0 2:e0 3:e1 4:e2 5:e1 6:e0 7:e2; expert 3 gets nothing.
  IVec idx = {2, 0, 0, 1, 2, 1, 0, 2}, off(5, -1), perm(8, -1);
  ops->moe_plan(I(idx, {4, 2}), 4, I(off, {5}), I(perm, {8}));
  EXPECT_EQ(off, (IVec{0, 3, 5, 8, 8}));
  EXPECT_EQ(perm, (IVec{1, 2, 6, 3, 5, 0, 4, 7}));
  IVec bad = {0, 4};
  EXPECT_THROW(ops->moe_plan(I(bad, {1, 2}), 4, I(off, {5}), I(perm, {2})), std::invalid_argument);
}

TEST_F(CpuOpsTest, MoePermuteUnpermuteHandMade) {
  const int k = 2;
  IVec perm = {1, 2, 6, 3, 5, 0, 4, 7};
  FVec x = {0.f, 1.f, 10.f, 11.f, 20.f, 21.f, 30.f, 31.f}, xp(16);
  ops->moe_permute(F(x, {4, 2}), I(perm, {8}), k, F(xp, {8, 2}));
  EXPECT_EQ(xp, (FVec{0, 1, 10, 11, 30, 31, 10, 11, 20, 21, 0, 1, 20, 21, 30, 31}));
  FVec yp(16), out(8, 99.f);
  for (int p = 0; p < 16; ++p) yp[p] = float(p);
  ops->moe_unpermute(F(yp, {8, 2}), I(perm, {8}), k, F(out, {4, 2}));
  // Token 0 <- permuted rows 0 (slot 1) and 5 (slot 0); token 1 <- rows 1, 3; token 2 <- 4, 6; token 3 <- 2, 7.
  EXPECT_EQ(out, (FVec{0 + 10, 1 + 11, 2 + 6, 3 + 7, 8 + 12, 9 + 13, 4 + 14, 5 + 15}));
  FVec w = {0.f, 0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f}, wp(8), back(8, 5.f);
  ops->moe_permute_weights(F(w, {8}), I(perm, {8}), F(wp, {8}));
  EXPECT_EQ(wp, (FVec{0.1f, 0.2f, 0.6f, 0.3f, 0.5f, 0.f, 0.4f, 0.7f}));
  ops->moe_unpermute_weights(F(wp, {8}), I(perm, {8}), F(back, {8}));
  EXPECT_EQ(back, w);
}

// ---- grouped GEMM -------------------------------------------------------------------------------------

TEST_F(CpuOpsTest, GroupedGemmMatchesNaiveWithEmptyExpertAndTail) {
  const int64_t E = 4, in = 6, out = 5, R = 18;
  IVec off = {0, 5, 5, 14, 16};  // expert 1 has no rows; rows 16, 17 are unused capacity
  FVec x = uniform(R * in, rng), W = uniform(E * out * in, rng), y(R * out, 42.f);
  ops->grouped_gemm(F(x, {R, in}), F(W, {E, out, in}), I(off, {E + 1}), F(y, {R, out}));
  FVec dy = uniform(R * out, rng), dx(R * in, 42.f), dW(E * out * in, 0.5f);
  ops->grouped_gemm_dgrad(F(dy, {R, out}), F(W, {E, out, in}), I(off, {E + 1}), F(dx, {R, in}));
  ops->grouped_gemm_wgrad(F(dy, {R, out}), F(x, {R, in}), I(off, {E + 1}), F(dW, {E, out, in}));
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t r = off[e]; r < off[e + 1]; ++r) {
      for (int64_t o = 0; o < out; ++o) {
        double s = 0;
        for (int64_t i = 0; i < in; ++i) s += double(x[r * in + i]) * W[(e * out + o) * in + i];
        EXPECT_NEAR(y[r * out + o], s, 1e-5);
      }
      for (int64_t i = 0; i < in; ++i) {
        double s = 0;
        for (int64_t o = 0; o < out; ++o) s += double(dy[r * out + o]) * W[(e * out + o) * in + i];
        EXPECT_NEAR(dx[r * in + i], s, 1e-5);
      }
    }
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i) {
        double s = 0.5;
        for (int64_t r = off[e]; r < off[e + 1]; ++r) s += double(dy[r * out + o]) * x[r * in + i];
        EXPECT_NEAR(dW[(e * out + o) * in + i], s, 1e-5);
      }
  }
  for (int64_t j = 16 * out; j < R * out; ++j) EXPECT_EQ(y[j], 0.f);
  for (int64_t j = 16 * in; j < R * in; ++j) EXPECT_EQ(dx[j], 0.f);
  IVec bad = {0, 5, 4, 14, 16};
  EXPECT_THROW(ops->grouped_gemm(F(x, {R, in}), F(W, {E, out, in}), I(bad, {E + 1}), F(y, {R, out})),
               std::invalid_argument);
}

// ---- SwiGLU -------------------------------------------------------------------------------------------

TEST_F(CpuOpsTest, SwigluMatchesNaive) {
  const int64_t R = 4, f = 6;
  FVec h = uniform(R * 2 * f, rng, -4.f, 4.f), wp = uniform(R, rng, 0.1f, 1.f), a(R * f);
  ops->swiglu_forward(F(h, {R, 2 * f}), F(wp, {R}), F(a, {R, f}));
  for (int64_t r = 0; r < R; ++r)
    for (int64_t i = 0; i < f; ++i) {
      const double g = h[r * 2 * f + i], u = h[r * 2 * f + f + i];
      EXPECT_NEAR(a[r * f + i], g / (1 + std::exp(-g)) * u * wp[r], 1e-5);
    }
}

// ---- LM head + loss -----------------------------------------------------------------------------------

TEST_F(CpuOpsTest, LmHeadLossMatchesNaiveLogSoftmax) {
  const int64_t T = 150, V = 37, d = 12;  // 150 tokens span three 64-row chunks
  FVec h = uniform(T * d, rng, -2.f, 2.f), W = uniform(V * d, rng);
  IVec labels(T);
  std::uniform_int_distribution<int> pick(0, V - 1);
  for (int64_t t = 0; t < T; ++t) labels[t] = (t % 7 == 3) ? -100 : pick(rng);
  labels[T - 1] = -100;
  double loss = 0;
  std::vector<double> dh_ref(T * d, 0.0);
  const float gs = 0.25f;
  for (int64_t t = 0; t < T; ++t) {
    if (labels[t] < 0) continue;
    std::vector<double> z(V);
    double mx = -1e300;
    for (int64_t v = 0; v < V; ++v) {
      for (int64_t j = 0; j < d; ++j) z[v] += double(h[t * d + j]) * W[v * d + j];
      mx = std::max(mx, z[v]);
    }
    double s = 0;
    for (double zv : z) s += std::exp(zv - mx);
    loss += -(z[labels[t]] - mx - std::log(s));
    for (int64_t v = 0; v < V; ++v) {
      const double g = gs * (std::exp(z[v] - mx) / s - (v == labels[t]));
      for (int64_t j = 0; j < d; ++j) dh_ref[t * d + j] += g * W[v * d + j];
    }
  }
  FVec ls = {2.f}, dh(T * d, 9.f), dW(V * d, 0.f);
  ops->lm_head_loss(F(h, {T, d}), F(W, {V, d}), I(labels, {T}), gs, F(ls, {1}), F(dh, {T, d}), F(dW, {V, d}));
  EXPECT_NEAR(ls[0], 2.0 + loss, 1e-5 * loss);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < d; ++j) ASSERT_NEAR(dh[t * d + j], dh_ref[t * d + j], 1e-5) << t;
  // Loss only: empty dh, dW untouched.
  FVec ls2 = {0.f}, dW2(V * d, 3.f);
  ops->lm_head_loss(F(h, {T, d}), F(W, {V, d}), I(labels, {T}), 1.f, F(ls2, {1}), Tensor(), F(dW2, {V, d}));
  EXPECT_NEAR(ls2[0], loss, 1e-5 * loss);
  for (float g : dW2) EXPECT_EQ(g, 3.f);
  labels[0] = V;
  EXPECT_THROW(ops->lm_head_loss(F(h, {T, d}), F(W, {V, d}), I(labels, {T}), 1.f, F(ls2, {1}), Tensor(), Tensor()),
               std::invalid_argument);
}

// ---- AdamW --------------------------------------------------------------------------------------------

TEST_F(CpuOpsTest, AdamwTwoStepsHandComputed) {
  // p = 1; g = 0.5 then -0.25; lr 0.1, wd 0.1, betas (0.9, 0.95), eps 1e-8 (values from the torch formula).
  FVec p = {1.f}, g = {0.5f}, m = {0.f}, v = {0.f};
  mxt::AdamWStep s;
  s.lr = 0.1f;
  s.weight_decay = 0.1f;
  s.step = 1;
  ops->adamw_step(F(p, {1}), F(g, {1}), F(m, {1}), F(v, {1}), s);
  EXPECT_NEAR(m[0], 0.05, 1e-7);
  EXPECT_NEAR(v[0], 0.0125, 1e-8);
  EXPECT_NEAR(p[0], 0.890000002, 1e-6);
  g[0] = -0.25f;
  s.step = 2;
  ops->adamw_step(F(p, {1}), F(g, {1}), F(m, {1}), F(v, {1}), s);
  EXPECT_NEAR(m[0], 0.02, 1e-7);
  EXPECT_NEAR(v[0], 0.015, 1e-8);
  EXPECT_NEAR(p[0], 0.8542630578558273, 1e-6);
}

// The default adamw_step_to (the CPU backend's): the step, then the updated master's prefix into the working copy.
TEST_F(CpuOpsTest, AdamwStepToCopiesTheUpdatedPrefix) {
  const int64_t n = 37;
  FVec p = uniform(n, rng), g = uniform(n, rng), m = uniform(n, rng, -0.1f, 0.1f), v = uniform(n, rng, 0.001f, 0.1f);
  const FVec p0 = p, m0 = m, v0 = v;
  FVec p2 = p, m2 = m, v2 = v, w(n - 4, -7.f);
  mxt::AdamWStep s;
  s.lr = 1e-2f;
  s.step = 3;
  ops->adamw_step(F(p, {n}), F(g, {n}), F(m, {n}), F(v, {n}), s);
  ops->adamw_step_to(F(p2, {n}), F(g, {n}), F(m2, {n}), F(v2, {n}), s, F(w, {n - 4}));
  EXPECT_EQ(p2, p);
  EXPECT_EQ(m2, m);
  EXPECT_EQ(v2, v);
  EXPECT_EQ(w, FVec(p.begin(), p.end() - 4));
  // An empty working copy: the plain step.
  FVec p3 = p0, m3 = m0, v3 = v0, p4 = p0, m4 = m0, v4 = v0;
  ops->adamw_step(F(p3, {n}), F(g, {n}), F(m3, {n}), F(v3, {n}), s);
  ops->adamw_step_to(F(p4, {n}), F(g, {n}), F(m4, {n}), F(v4, {n}), s, mxt::Tensor());
  EXPECT_EQ(p4, p3);
  EXPECT_EQ(m4, m3);
  EXPECT_EQ(v4, v3);
  EXPECT_NE(p4, p0);
}

// BF16 moments (adamw_moments_dtype=bfloat16): the parameter moves exactly as with F32 moments holding the same
// values (the moments are used unrounded), and each moment is stored as the F32 step's, rounded to nearest even.
TEST_F(CpuOpsTest, AdamwBf16MomentsAreTheF32StepRounded) {
  const int64_t n = 301;
  FVec p = uniform(n, rng), g = uniform(n, rng, -2.f, 2.f), m = uniform(n, rng, -0.1f, 0.1f);
  FVec v = uniform(n, rng, 1e-6f, 0.1f);
  for (auto* x : {&m, &v})
    for (float& e : *x) e = mxt::round_to_bf16(e);  // bf16 values
  std::vector<uint16_t> mb(n), vb(n);
  for (int64_t i = 0; i < n; ++i) mb[i] = mxt::f32_to_bf16_bits(m[i]), vb[i] = mxt::f32_to_bf16_bits(v[i]);
  FVec pb = p;
  mxt::AdamWStep s;
  s.lr = 3e-3f;
  s.weight_decay = 0.1f;
  s.step = 5;
  s.grad_scale = 0.7f;
  ops->adamw_step(F(p, {n}), F(g, {n}), F(m, {n}), F(v, {n}), s);
  const mxt::Tensor tm(mb.data(), mxt::DType::BF16, {n}), tv(vb.data(), mxt::DType::BF16, {n});
  ops->adamw_step(F(pb, {n}), F(g, {n}), tm, tv, s);
  EXPECT_EQ(pb, p);
  int64_t rounded_away = 0;
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(mb[i], mxt::f32_to_bf16_bits(m[i])) << i;
    EXPECT_EQ(vb[i], mxt::f32_to_bf16_bits(v[i])) << i;
    rounded_away += mxt::bf16_bits_to_f32(mb[i]) != m[i];
  }
  EXPECT_GT(rounded_away, n / 2);  // the F32 moments left bf16's grid: the rounding was exercised
  // Moments of two dtypes are refused.
  EXPECT_THROW(ops->adamw_step(F(pb, {n}), F(g, {n}), tm, F(v, {n}), s), std::exception);
}

TEST_F(CpuOpsTest, AdamwGradScaleAndVectorMatchFormula) {
  const int64_t n = 50;
  FVec p = uniform(n, rng), g = uniform(n, rng), m = uniform(n, rng, -0.1f, 0.1f), v = uniform(n, rng, 0.001f, 0.1f);
  FVec p0 = p, m0 = m, v0 = v;
  mxt::AdamWStep s;
  s.lr = 3e-3f;
  s.weight_decay = 0.033f;
  s.step = 7;
  s.grad_scale = 0.4f;
  ops->adamw_step(F(p, {n}), F(g, {n}), F(m, {n}), F(v, {n}), s);
  for (int64_t i = 0; i < n; ++i) {
    const double gi = 0.4 * g[i];
    const double mi = 0.9 * m0[i] + 0.1 * gi, vi = 0.95 * v0[i] + 0.05 * gi * gi;
    const double pi = p0[i] * (1 - 3e-3 * 0.033) -
                      3e-3 / (1 - std::pow(0.9, 7)) * mi / (std::sqrt(vi) / std::sqrt(1 - std::pow(0.95, 7)) + 1e-8);
    EXPECT_NEAR(m[i], mi, 1e-7);
    EXPECT_NEAR(v[i], vi, 1e-8);
    EXPECT_NEAR(p[i], pi, 1e-6);
  }
}
