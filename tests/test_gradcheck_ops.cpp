// Finite-difference gradient checks for every CPU op with a backward. Each check builds a scalar
// L = sum(output * R) with a fixed random R, so the analytic gradient is the op's backward applied to R,
// and compares it with central differences of L in the inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cpu/cpu_ops.hpp"
#include "host_test_util.hpp"

using mxt::DType;
using mxt::Tensor;

namespace {

using mxt::testing::FVec;
using mxt::testing::IVec;
const float kNaN = std::numeric_limits<float>::quiet_NaN();

using mxt::testing::F;
using mxt::testing::I;
using mxt::testing::uniform;

double dot(const FVec& a, const FVec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * b[i];
  return s;
}

struct GradCheck {
  float eps = 1e-3f;
  double rtol = 1e-2, atol = 1e-3;
  size_t max_checks = 60;
};

// Central differences of L in x (all entries, or a random subset of max_checks for big tensors) against
// `analytic`. The gradient must also be non-trivial, so a backward that returns zeros cannot pass.
void check_grad(const std::string& what, FVec& x, const FVec& analytic, const std::function<double()>& L,
                std::mt19937& rng, GradCheck c = {}) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  std::vector<size_t> idx(x.size());
  std::iota(idx.begin(), idx.end(), 0);
  if (idx.size() > c.max_checks) {
    std::shuffle(idx.begin(), idx.end(), rng);
    idx.resize(c.max_checks);
  }
  double max_abs = 0;
  int bad = 0;
  for (size_t i : idx) {
    const float x0 = x[i], xp = x0 + c.eps, xm = x0 - c.eps;
    x[i] = xp;
    const double lp = L();
    x[i] = xm;
    const double lm = L();
    x[i] = x0;
    const double num = (lp - lm) / (double(xp) - double(xm));
    const double ana = analytic[i];
    max_abs = std::max(max_abs, std::abs(ana));
    if (std::abs(num - ana) > c.atol + c.rtol * std::abs(ana) && bad++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: analytic " << ana << " vs numeric " << num;
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << idx.size() << " entries disagree";
  EXPECT_GT(max_abs, 0.05) << what << ": gradient is (nearly) zero everywhere, the check would be vacuous";
}

class GradCheckOps : public ::testing::Test {
 protected:
  std::unique_ptr<mxt::Ops> ops = mxt::make_cpu_ops();
  std::mt19937 rng{20240601};
};

}  // namespace

TEST_F(GradCheckOps, Gemm) {
  const int64_t M = 4, N = 5, K = 3;
  const float alpha = 0.7f, beta = 0.3f;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      SCOPED_TRACE("trans_a " + std::to_string(ta) + " trans_b " + std::to_string(tb));
      FVec A = uniform(M * K, rng), B = uniform(K * N, rng), C0 = uniform(M * N, rng), R = uniform(M * N, rng);
      const int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
      auto L = [&] {
        FVec C = C0;
        ops->gemm(ta, tb, M, N, K, alpha, F(A, {ar, ac}), F(B, {br, bc}), beta, F(C, {M, N}));
        return dot(C, R);
      };
      // The backward GEMMs a layer would run: d op(A) = alpha R op(B)^T, d op(B) = alpha op(A)^T R.
      FVec dA(M * K, kNaN), dB(K * N, kNaN);
      if (!ta) ops->gemm(false, !tb, M, K, N, alpha, F(R, {M, N}), F(B, {br, bc}), 0.f, F(dA, {M, K}));
      else ops->gemm(tb, true, K, M, N, alpha, F(B, {br, bc}), F(R, {M, N}), 0.f, F(dA, {K, M}));
      if (!tb) ops->gemm(!ta, false, K, N, M, alpha, F(A, {ar, ac}), F(R, {M, N}), 0.f, F(dB, {K, N}));
      else ops->gemm(true, ta, N, K, M, alpha, F(R, {M, N}), F(A, {ar, ac}), 0.f, F(dB, {N, K}));
      check_grad("dA", A, dA, L, rng);
      check_grad("dB", B, dB, L, rng);
    }
}

TEST_F(GradCheckOps, Embedding) {
  const int64_t V = 7, d = 4, T = 6;
  IVec ids = {3, 0, 3, 6, 2, 3};  // repeats must accumulate
  FVec table = uniform(V * d, rng), R = uniform(T * d, rng);
  auto L = [&] {
    FVec out(T * d);
    ops->embedding_forward(I(ids, {T}), F(table, {V, d}), F(out, {T, d}));
    return dot(out, R);
  };
  FVec dtable(V * d, 0.f);
  ops->embedding_backward(I(ids, {T}), F(R, {T, d}), F(dtable, {V, d}));
  check_grad("dtable", table, dtable, L, rng, {1e-3f, 1e-2, 1e-3, 1000});
}

TEST_F(GradCheckOps, RmsNorm) {
  const int64_t T = 4, d = 8;
  const float eps = 1e-5f;
  FVec x = uniform(T * d, rng, -2.f, 2.f), w = uniform(d, rng, 0.5f, 1.5f), R = uniform(T * d, rng);
  auto L = [&] {
    FVec y(T * d), rstd(T);
    ops->rmsnorm_forward(F(x, {T, d}), F(w, {d}), eps, F(y, {T, d}), F(rstd, {T}));
    return dot(y, R);
  };
  FVec y(T * d), rstd(T), dx(T * d, kNaN), dw(d, 0.25f);  // dx is overwritten, dw accumulates
  ops->rmsnorm_forward(F(x, {T, d}), F(w, {d}), eps, F(y, {T, d}), F(rstd, {T}));
  ops->rmsnorm_backward(F(R, {T, d}), F(x, {T, d}), F(w, {d}), F(rstd, {T}), F(dx, {T, d}), F(dw, {d}));
  for (auto& g : dw) g -= 0.25f;
  check_grad("dx", x, dx, L, rng, {1e-3f, 1e-2, 1e-3, 1000});
  check_grad("dw", w, dw, L, rng);
}

TEST_F(GradCheckOps, Rope) {
  const int64_t T = 5, H = 2, D = 8;
  FVec x = uniform(T * H * D, rng), R = uniform(T * H * D, rng);
  IVec pos = {0, 1, 9, 130, 4000};
  const float theta = 10000.f;
  auto L = [&] {
    FVec y = x;
    ops->rope_forward(F(y, {T, H, D}), I(pos, {T}), theta);
    return dot(y, R);
  };
  FVec dx = R;
  ops->rope_backward(F(dx, {T, H, D}), I(pos, {T}), theta);
  check_grad("dx", x, dx, L, rng, {1e-3f, 1e-2, 1e-3, 1000});
}

TEST_F(GradCheckOps, AttentionGqaBatch2) {
  mxt::AttnShape s{2, 6, 4, 2, 8};
  const int64_t T = s.batch * s.seq, H = 4, KVH = 2, D = 8;
  FVec q = uniform(T * H * D, rng, -1.5f, 1.5f), k = uniform(T * KVH * D, rng, -1.5f, 1.5f);
  FVec v = uniform(T * KVH * D, rng), R = uniform(T * H * D, rng);
  auto fwd = [&](FVec& out, FVec& lse) {
    ops->attention_forward(s, F(q, {T, H, D}), F(k, {T, KVH, D}), F(v, {T, KVH, D}), F(out, {T, H, D}),
                           F(lse, {s.batch, H, s.seq}));
  };
  auto L = [&] {
    FVec out(T * H * D), lse(s.batch * H * s.seq);
    fwd(out, lse);
    return dot(out, R);
  };
  FVec out(T * H * D), lse(s.batch * H * s.seq);
  fwd(out, lse);
  FVec dq(q.size(), kNaN), dk(k.size(), kNaN), dv(v.size(), kNaN);
  ops->attention_backward(s, F(R, {T, H, D}), F(q, {T, H, D}), F(k, {T, KVH, D}), F(v, {T, KVH, D}),
                          F(out, {T, H, D}), F(lse, {s.batch, H, s.seq}), F(dq, {T, H, D}), F(dk, {T, KVH, D}),
                          F(dv, {T, KVH, D}));
  const GradCheck c{1e-3f, 1e-2, 1e-3, 120};
  check_grad("dq", q, dq, L, rng, c);
  check_grad("dk", k, dk, L, rng, c);
  check_grad("dv", v, dv, L, rng, c);
}

namespace {

// Logits whose top-k set cannot change under a 1e-3 perturbation: each row is a shuffled ladder of
// values 0.4 apart plus small noise.
FVec separated_logits(int64_t T, int64_t E, std::mt19937& rng) {
  FVec l(T * E);
  std::uniform_real_distribution<float> noise(-0.05f, 0.05f);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    for (int64_t e = 0; e < E; ++e) l[t * E + e] = 0.4f * order[e] - 1.f + noise(rng);
  }
  return l;
}

}  // namespace

TEST_F(GradCheckOps, RouterThroughTopkAndExtra) {
  const int64_t T = 5, E = 6;
  for (int k : {1, 2, 3})
    for (bool extra : {false, true}) {
      if (k == 1 && !extra) continue;  // a single renormalised weight is constant 1: no gradient at all
      SCOPED_TRACE("k " + std::to_string(k) + (extra ? " with dprobs_extra" : " without dprobs_extra"));
      FVec logits = separated_logits(T, E, rng), Rw = uniform(T * k, rng), Rp = uniform(T * E, rng);
      FVec probs(T * E), w(T * k);
      IVec idx(T * k);
      ops->router_forward(F(logits, {T, E}), k, F(probs, {T, E}), I(idx, {T, k}), F(w, {T, k}));
      const IVec idx0 = idx;
      auto L = [&] {
        FVec p(T * E), tw(T * k);
        IVec ix(T * k);
        ops->router_forward(F(logits, {T, E}), k, F(p, {T, E}), I(ix, {T, k}), F(tw, {T, k}));
        EXPECT_EQ(ix, idx0) << "perturbation changed the top-k set";
        return dot(tw, Rw) + (extra ? dot(p, Rp) : 0.0);
      };
      FVec dlogits(T * E, kNaN);
      ops->router_backward(F(Rw, {T, k}), F(probs, {T, E}), I(idx, {T, k}), F(w, {T, k}),
                           extra ? F(Rp, {T, E}) : Tensor(), F(dlogits, {T, E}));
      check_grad("dlogits", logits, dlogits, L, rng, {1e-3f, 1e-2, 1e-3, 1000});
    }
}

TEST_F(GradCheckOps, MoePermuteUnpermuteAndWeights) {
  const int64_t T = 5, k = 2, E = 4, d = 3, n = T * k;
  IVec idx = {2, 0, 0, 3, 2, 3, 0, 2, 3, 0}, off(E + 1), perm(n);  // expert 1 gets nothing
  ops->moe_plan(I(idx, {T, k}), E, I(off, {E + 1}), I(perm, {n}));

  FVec x = uniform(T * d, rng), Rp = uniform(n * d, rng);
  auto Lp = [&] {
    FVec xp(n * d);
    ops->moe_permute(F(x, {T, d}), I(perm, {n}), k, F(xp, {n, d}));
    return dot(xp, Rp);
  };
  FVec dx(T * d, kNaN);
  ops->moe_unpermute(F(Rp, {n, d}), I(perm, {n}), k, F(dx, {T, d}));
  check_grad("moe_permute dx", x, dx, Lp, rng, {1e-3f, 1e-2, 1e-3, 1000});

  FVec yp = uniform(n * d, rng), Ru = uniform(T * d, rng);
  auto Lu = [&] {
    FVec out(T * d);
    ops->moe_unpermute(F(yp, {n, d}), I(perm, {n}), k, F(out, {T, d}));
    return dot(out, Ru);
  };
  FVec dyp(n * d, kNaN);
  ops->moe_permute(F(Ru, {T, d}), I(perm, {n}), k, F(dyp, {n, d}));
  check_grad("moe_unpermute dyp", yp, dyp, Lu, rng, {1e-3f, 1e-2, 1e-3, 1000});

  FVec w = uniform(n, rng), Rw = uniform(n, rng);
  auto Lw = [&] {
    FVec wp(n);
    ops->moe_permute_weights(F(w, {n}), I(perm, {n}), F(wp, {n}));
    return dot(wp, Rw);
  };
  FVec dw(n, kNaN);
  ops->moe_unpermute_weights(F(Rw, {n}), I(perm, {n}), F(dw, {n}));
  check_grad("moe_permute_weights dw", w, dw, Lw, rng);
}

TEST_F(GradCheckOps, GroupedGemmUnevenLoads) {
  const int64_t E = 4, in = 5, out = 4, R = 10;
  IVec off = {0, 3, 3, 8, 10};  // loads 3, 0, 5, 2
  FVec x = uniform(R * in, rng), W = uniform(E * out * in, rng), Ry = uniform(R * out, rng);
  auto L = [&] {
    FVec y(R * out);
    ops->grouped_gemm(F(x, {R, in}), F(W, {E, out, in}), I(off, {E + 1}), F(y, {R, out}));
    return dot(y, Ry);
  };
  FVec dx(R * in, kNaN), dW(E * out * in, 0.f);
  ops->grouped_gemm_dgrad(F(Ry, {R, out}), F(W, {E, out, in}), I(off, {E + 1}), F(dx, {R, in}));
  ops->grouped_gemm_wgrad(F(Ry, {R, out}), F(x, {R, in}), I(off, {E + 1}), F(dW, {E, out, in}));
  for (int64_t j = out * in; j < 2 * out * in; ++j) EXPECT_EQ(dW[j], 0.f) << "empty expert got a gradient";
  check_grad("dx", x, dx, L, rng, {1e-3f, 1e-2, 1e-3, 1000});
  check_grad("dW", W, dW, L, rng, {1e-3f, 1e-2, 1e-3, 1000});
}

TEST_F(GradCheckOps, Swiglu) {
  const int64_t R = 5, f = 4;
  FVec h = uniform(R * 2 * f, rng, -3.f, 3.f), wp = uniform(R, rng, 0.2f, 1.f), Ra = uniform(R * f, rng);
  auto L = [&] {
    FVec a(R * f);
    ops->swiglu_forward(F(h, {R, 2 * f}), F(wp, {R}), F(a, {R, f}));
    return dot(a, Ra);
  };
  FVec dh(R * 2 * f, kNaN), dwp(R, kNaN);
  ops->swiglu_backward(F(Ra, {R, f}), F(h, {R, 2 * f}), F(wp, {R}), F(dh, {R, 2 * f}), F(dwp, {R}));
  check_grad("dh13", h, dh, L, rng, {1e-3f, 1e-2, 1e-3, 1000});
  check_grad("dwp", wp, dwp, L, rng);
}

TEST_F(GradCheckOps, LmHeadLossWithIgnoredLabels) {
  const int64_t T = 70, V = 23, d = 8;  // 70 tokens: two chunks
  const float gs = 0.5f;
  FVec h = uniform(T * d, rng, -2.f, 2.f), W = uniform(V * d, rng);
  IVec labels(T);
  std::uniform_int_distribution<int> pick(0, V - 1);
  for (int64_t t = 0; t < T; ++t) labels[t] = (t % 5 == 1) ? -100 : pick(rng);
  // The objective sums per-token losses in double: a single F32 loss_sum of ~200 would drown the
  // finite differences in rounding.
  auto L = [&] {
    double total = 0;
    const Tensor ht = F(h, {T, d}), lt = I(labels, {T});
    for (int64_t t = 0; t < T; ++t) {
      FVec ls = {0.f};
      ops->lm_head_loss(ht.rows(t, 1), F(W, {V, d}), lt.rows(t, 1), 1.f, F(ls, {1}), Tensor(), Tensor());
      total += ls[0];
    }
    return gs * total;
  };
  FVec ls = {0.f}, dh(T * d, kNaN), dW(V * d, 0.2f);
  ops->lm_head_loss(F(h, {T, d}), F(W, {V, d}), I(labels, {T}), gs, F(ls, {1}), F(dh, {T, d}), F(dW, {V, d}));
  for (auto& g : dW) g -= 0.2f;
  for (int64_t j = 0; j < d; ++j) EXPECT_EQ(dh[1 * d + j], 0.f) << "ignored token got a gradient";
  check_grad("dh", h, dh, L, rng, {1e-3f, 1e-2, 1e-3, 100});
  check_grad("dW", W, dW, L, rng, {1e-3f, 1e-2, 1e-3, 100});
}
