// CUDA router / MoE permutation / SwiGLU ops against their CPU twins on identical inputs (bf16-rounded where
// the CUDA dtype is bf16).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "cuda_test_util.hpp"

namespace mxt::testing {
namespace {

struct Backends {
  std::unique_ptr<Ops> gpu = make_cuda_ops();
  std::unique_ptr<Ops> cpu = make_cpu_ops();
};

// Router logits without near-ties: each row is a shuffled ladder of distinct values `step` apart (so the
// probabilities differ by a factor exp(step) >= 1.02, far above fp32 noise) plus a random per-row offset.
std::vector<float> ladder_logits(int64_t T, int64_t E, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> off(0.f, 1.f);
  const float step = std::max(0.02f, 6.f / static_cast<float>(E));
  std::vector<int> order(static_cast<size_t>(E));
  std::vector<float> out(static_cast<size_t>(T * E));
  for (int64_t t = 0; t < T; ++t) {
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    const float o = off(rng);
    for (int64_t e = 0; e < E; ++e) out[t * E + e] = o + step * static_cast<float>(order[e]);
  }
  return out;
}

// The CPU twin's router outputs for some logits (used as identical inputs for the backward / stats tests).
struct Routing {
  std::vector<float> probs, topk_w;
  std::vector<int32_t> idx;
};
Routing cpu_route(Ops& cpu, std::vector<float> logits, int64_t T, int64_t E, int k) {
  Routing r;
  r.probs.resize(T * E);
  r.topk_w.resize(T * k);
  r.idx.resize(T * k);
  cpu.router_forward(host(logits, {T, E}), k, host(r.probs, {T, E}), host_i32(r.idx, {T, k}),
                     host(r.topk_w, {T, k}));
  return r;
}

// topk_idx [T,k] with k distinct experts per token, drawn with a skewed load (weight ~ (e+1)^2) and expert
// `empty` never chosen (pass -1 for none).
std::vector<int32_t> skewed_topk(int64_t T, int E, int k, int empty, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<double> w(static_cast<size_t>(E));
  for (int e = 0; e < E; ++e) w[e] = e == empty ? 0.0 : double(e + 1) * double(e + 1);
  std::discrete_distribution<int> pick(w.begin(), w.end());
  std::vector<int32_t> idx(static_cast<size_t>(T * k));
  for (int64_t t = 0; t < T; ++t) {
    for (int j = 0; j < k; ++j) {
      int e;
      do {
        e = pick(rng);
      } while (std::find(idx.begin() + t * k, idx.begin() + t * k + j, e) != idx.begin() + t * k + j);
      idx[t * k + j] = e;
    }
  }
  return idx;
}

// A random permutation of [0, n) as a perm (the ops only need a permutation, not a plan's).
std::vector<int32_t> random_perm(int64_t n, uint32_t seed) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), 0);
  std::mt19937 rng(seed);
  std::shuffle(p.begin(), p.end(), rng);
  return p;
}

// ---- router ---------------------------------------------------------------------------------------------

struct RouterShape {
  int64_t T, E;
  int k;
};
const RouterShape kRouterShapes[] = {{37, 8, 2}, {50, 4, 2}, {129, 64, 6}, {33, 256, 8}, {7, 5, 5}, {3, 40, 1}};

void check_router_forward(Ops& gpu, Ops& cpu, const std::vector<float>& logits, int64_t T, int64_t E, int k) {
  SCOPED_TRACE("T=" + std::to_string(T) + " E=" + std::to_string(E) + " k=" + std::to_string(k));
  const Routing ref = cpu_route(cpu, logits, T, E, k);
  DeviceTensor lg = upload(gpu, logits, DType::F32, {T, E});
  DeviceTensor pr(gpu, DType::F32, {T, E}), ix(gpu, DType::I32, {T, k}), tw(gpu, DType::F32, {T, k});
  gpu.router_forward(lg, k, pr, ix, tw);
  const auto probs = download(gpu, pr), w = download(gpu, tw);
  const auto idx = download_i32(gpu, ix);
  // fp32 softmax with expf vs the twin's fp64 exp: a few ulp.
  EXPECT_CLOSE_REL(probs, ref.probs, 1e-6);
  EXPECT_EQ(idx, ref.idx);
  EXPECT_CLOSE_REL(w, ref.topk_w, 1e-6);
  // The renormalised weights sum to 1 per token.
  for (int64_t t = 0; t < T; ++t) {
    double s = 0;
    for (int j = 0; j < k; ++j) s += w[t * k + j];
    EXPECT_NEAR(s, 1.0, 1e-5) << "token " << t;
  }
}

TEST(CudaMoe, RouterForward) {
  MXT_REQUIRE_GPU();
  Backends b;
  uint32_t seed = 100;
  for (const auto& s : kRouterShapes) check_router_forward(*b.gpu, *b.cpu, ladder_logits(s.T, s.E, seed++), s.T, s.E, s.k);
}

// Exact ties (integer logits, many repeats): equal logits give bit-equal probabilities on both sides, and the
// lower index must win on both.
TEST(CudaMoe, RouterForwardTiesToLowerIndex) {
  MXT_REQUIRE_GPU();
  Backends b;
  const int64_t T = 40, E = 16;
  const int k = 5;
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> level(0, 2);
  std::vector<float> logits(T * E);
  for (auto& x : logits) x = static_cast<float>(level(rng));
  check_router_forward(*b.gpu, *b.cpu, logits, T, E, k);
}

TEST(CudaMoe, RouterForwardRejectsTooManyExperts) {
  MXT_REQUIRE_GPU();
  Backends b;
  const int64_t T = 2, E = 257;
  DeviceTensor lg(*b.gpu, DType::F32, {T, E}), pr(*b.gpu, DType::F32, {T, E}), ix(*b.gpu, DType::I32, {T, 2}),
      tw(*b.gpu, DType::F32, {T, 2});
  EXPECT_THROW(b.gpu->router_forward(lg, 2, pr, ix, tw), std::runtime_error);
}

TEST(CudaMoe, RouterBackward) {
  MXT_REQUIRE_GPU();
  Backends b;
  uint32_t seed = 200;
  for (const auto& s : kRouterShapes) {
    const int64_t T = s.T, E = s.E;
    const int k = s.k;
    const Routing r = cpu_route(*b.cpu, ladder_logits(T, E, seed++), T, E, k);
    std::vector<float> g = randn(T * k, seed++), extra = randn(T * E, seed++, 0.1f);
    DeviceTensor dg = upload(*b.gpu, g, DType::F32, {T, k}), pr = upload(*b.gpu, r.probs, DType::F32, {T, E}),
                 ix = upload_i32(*b.gpu, r.idx, {T, k}), tw = upload(*b.gpu, r.topk_w, DType::F32, {T, k}),
                 ex = upload(*b.gpu, extra, DType::F32, {T, E});
    DeviceTensor dl(*b.gpu, DType::F32, {T, E});
    for (bool with_extra : {false, true}) {
      SCOPED_TRACE("T=" + std::to_string(T) + " E=" + std::to_string(E) + " k=" + std::to_string(k) +
                   (with_extra ? " with dprobs_extra" : " without dprobs_extra"));
      std::vector<float> ref(T * E), probs = r.probs, tw_h = r.topk_w;
      std::vector<int32_t> idx = r.idx;
      b.cpu->router_backward(host(g, {T, k}), host(probs, {T, E}), host_i32(idx, {T, k}), host(tw_h, {T, k}),
                             with_extra ? host(extra, {T, E}) : Tensor(), host(ref, {T, E}));
      b.gpu->router_backward(dg, pr, ix, tw, with_extra ? ex.t : Tensor(), dl);
      // Both accumulate in fp64; the inputs are identical F32.
      EXPECT_CLOSE_REL(download(*b.gpu, dl), ref, 1e-5);
    }
  }
}

TEST(CudaMoe, RouterAuxStats) {
  MXT_REQUIRE_GPU();
  Backends b;
  // T = 1000 spans 8 row chunks; T = 20000 hits the chunk cap with several rows per chunk.
  const RouterShape shapes[] = {{37, 8, 2}, {1000, 8, 2}, {333, 64, 6}, {20000, 16, 4}, {129, 256, 8}};
  uint32_t seed = 300;
  for (const auto& s : shapes) {
    const int64_t T = s.T, E = s.E;
    const int k = s.k;
    SCOPED_TRACE("T=" + std::to_string(T) + " E=" + std::to_string(E) + " k=" + std::to_string(k));
    const Routing r = cpu_route(*b.cpu, ladder_logits(T, E, seed++), T, E, k);
    // Accumulate into non-zero starting values.
    std::vector<float> ps0 = randn(E, seed++), cn0(E);
    for (int64_t e = 0; e < E; ++e) cn0[e] = static_cast<float>(e % 5);
    std::vector<float> ps = ps0, cn = cn0, probs = r.probs;
    std::vector<int32_t> idx = r.idx;
    b.cpu->router_aux_stats(host(probs, {T, E}), host_i32(idx, {T, k}), host(ps, {E}), host(cn, {E}));
    DeviceTensor pr = upload(*b.gpu, r.probs, DType::F32, {T, E}), ix = upload_i32(*b.gpu, r.idx, {T, k}),
                 gps = upload(*b.gpu, ps0, DType::F32, {E}), gcn = upload(*b.gpu, cn0, DType::F32, {E});
    b.gpu->router_aux_stats(pr, ix, gps, gcn);
    EXPECT_CLOSE_REL(download(*b.gpu, gps), ps, 1e-6);
    EXPECT_EQ(download(*b.gpu, gcn), cn);
    // Deterministic: a second identical call adds exactly the same amounts.
    b.gpu->router_aux_stats(pr, ix, gps, gcn);
    b.cpu->router_aux_stats(host(probs, {T, E}), host_i32(idx, {T, k}), host(ps, {E}), host(cn, {E}));
    EXPECT_EQ(download(*b.gpu, gcn), cn);
  }
}

TEST(CudaMoe, BroadcastRows) {
  MXT_REQUIRE_GPU();
  Backends b;
  const int64_t T = 77, E = 13;
  std::vector<float> coef = randn(E, 400), ref(T * E);
  b.cpu->broadcast_rows(host(coef, {E}), host(ref, {T, E}));
  DeviceTensor c = upload(*b.gpu, coef, DType::F32, {E});
  DeviceTensor d = upload(*b.gpu, randn(T * E, 401), DType::F32, {T, E});  // stale values to overwrite
  b.gpu->broadcast_rows(c, d);
  EXPECT_EQ(download(*b.gpu, d), ref);
}

// ---- moe_plan -------------------------------------------------------------------------------------------

TEST(CudaMoe, PlanMatchesTwin) {
  MXT_REQUIRE_GPU();
  Backends b;
  struct Case {
    int64_t T;
    int E, k, empty;
  };
  // Skewed loads, one expert with no token (also the last expert, and expert 0); 8192 x 8 = 65536 slots over
  // 256 experts; more experts than slots.
  const Case cases[] = {{37, 8, 2, 5},     {50, 4, 2, 0},      {1000, 64, 6, 63}, {8192, 256, 8, 17},
                        {3001, 16, 3, -1}, {5, 300, 2, 1},     {1, 1, 1, -1},     {4096, 8, 8, -1}};
  uint32_t seed = 500;
  for (const auto& c : cases) {
    SCOPED_TRACE("T=" + std::to_string(c.T) + " E=" + std::to_string(c.E) + " k=" + std::to_string(c.k));
    const int64_t n = c.T * c.k;
    std::vector<int32_t> idx = skewed_topk(c.T, c.E, c.k, c.empty, seed++);
    std::vector<int32_t> off_ref(c.E + 1), perm_ref(n);
    b.cpu->moe_plan(host_i32(idx, {c.T, c.k}), c.E, host_i32(off_ref, {c.E + 1}), host_i32(perm_ref, {n}));
    if (c.empty >= 0) {
      ASSERT_EQ(off_ref[c.empty], off_ref[c.empty + 1]) << "the test meant an empty expert";
    }
    DeviceTensor ix = upload_i32(*b.gpu, idx, {c.T, c.k});
    // Stale contents to overwrite.
    DeviceTensor off = upload_i32(*b.gpu, std::vector<int32_t>(c.E + 1, 12345), {c.E + 1});
    DeviceTensor perm = upload_i32(*b.gpu, std::vector<int32_t>(n, -7), {n});
    b.gpu->moe_plan(ix, c.E, off, perm);
    EXPECT_EQ(download_i32(*b.gpu, off), off_ref);
    EXPECT_EQ(download_i32(*b.gpu, perm), perm_ref);
  }
}

// ---- permutation of rows and weights --------------------------------------------------------------------

TEST(CudaMoe, PermuteUnpermuteRows) {
  MXT_REQUIRE_GPU();
  Backends b;
  struct Case {
    int64_t T, d;
    int k, E;
  };
  // d = 64 / 4096: 16-byte vector path; d = 37: element path.
  const Case cases[] = {{37, 64, 2, 8}, {50, 37, 2, 4}, {129, 96, 6, 64}, {16, 4096, 2, 8}, {11, 8, 1, 3}};
  uint32_t seed = 600;
  for (const auto& c : cases) {
    SCOPED_TRACE("T=" + std::to_string(c.T) + " d=" + std::to_string(c.d) + " k=" + std::to_string(c.k));
    const int64_t T = c.T, d = c.d, n = T * c.k;
    const int k = c.k;
    // A real plan's perm (uneven loads, an empty expert).
    std::vector<int32_t> idx = skewed_topk(T, c.E, k, c.E - 1, seed++), off(c.E + 1), perm(n);
    b.cpu->moe_plan(host_i32(idx, {T, k}), c.E, host_i32(off, {c.E + 1}), host_i32(perm, {n}));
    DeviceTensor pm = upload_i32(*b.gpu, perm, {n});

    std::vector<float> x = randn(T * d, seed++);
    round_bf16(x);
    std::vector<float> xp_ref(n * d);
    b.cpu->moe_permute(host(x, {T, d}), host_i32(perm, {n}), k, host(xp_ref, {n, d}));
    DeviceTensor gx = upload(*b.gpu, x, DType::BF16, {T, d}), gxp(*b.gpu, DType::BF16, {n, d});
    b.gpu->moe_permute(gx, pm, k, gxp);
    EXPECT_EQ(download(*b.gpu, gxp), xp_ref);  // a pure copy of bf16 values: exact

    std::vector<float> yp = randn(n * d, seed++);
    round_bf16(yp);
    std::vector<float> out_ref(T * d);
    b.cpu->moe_unpermute(host(yp, {n, d}), host_i32(perm, {n}), k, host(out_ref, {T, d}));
    DeviceTensor gyp = upload(*b.gpu, yp, DType::BF16, {n, d});
    DeviceTensor gout = upload(*b.gpu, randn(T * d, seed++), DType::BF16, {T, d});  // stale values
    b.gpu->moe_unpermute(gyp, pm, k, gout);
    // fp32 sums of the same bf16 inputs, rounded once to bf16: ~2e-3 relative.
    const auto got = download(*b.gpu, gout);
    EXPECT_CLOSE_REL(got, out_ref, 1e-2);
    if (k == 1) {
      EXPECT_EQ(got, out_ref);  // a single row per token is copied exactly
    }
  }
}

// The fused unpermute + residual add gives the bits of moe_unpermute into a scratch and add (the Ops default,
// which the CPU twin runs), with the vector and the element kernels, out apart from res and aliasing it.
TEST(CudaMoe, UnpermuteAddIsUnpermuteThenAdd) {
  MXT_REQUIRE_GPU();
  Backends b;
  struct Case {
    int64_t T, d;
    int k, E;
  };
  uint32_t seed = 900;
  for (const Case c : {Case{37, 64, 2, 8}, Case{50, 37, 2, 4}, Case{16, 4096, 2, 8}}) {
    SCOPED_TRACE("T=" + std::to_string(c.T) + " d=" + std::to_string(c.d));
    const int64_t T = c.T, d = c.d, n = T * c.k;
    const int k = c.k;
    std::vector<int32_t> idx = skewed_topk(T, c.E, k, c.E - 1, seed++), off(c.E + 1), perm(n);
    b.cpu->moe_plan(host_i32(idx, {T, k}), c.E, host_i32(off, {c.E + 1}), host_i32(perm, {n}));
    DeviceTensor pm = upload_i32(*b.gpu, perm, {n});
    std::vector<float> yp = randn(n * d, seed++), res = randn(T * d, seed++);
    round_bf16(yp);
    round_bf16(res);
    std::vector<float> ref(T * d), tmp(T * d);
    b.cpu->moe_unpermute_add(host(yp, {n, d}), host_i32(perm, {n}), k, host(res, {T, d}), host(ref, {T, d}),
                             host(tmp, {T, d}));
    DeviceTensor gyp = upload(*b.gpu, yp, DType::BF16, {n, d}), gres = upload(*b.gpu, res, DType::BF16, {T, d});
    DeviceTensor gtmp(*b.gpu, DType::BF16, {T, d}), two(*b.gpu, DType::BF16, {T, d}), one(*b.gpu, DType::BF16, {T, d});
    b.gpu->moe_unpermute(gyp, pm, k, gtmp);
    b.gpu->add(gres, gtmp, two);
    b.gpu->moe_unpermute_add(gyp, pm, k, gres, one, gtmp);
    const auto want = download(*b.gpu, two);
    EXPECT_EQ(download(*b.gpu, one), want);
    EXPECT_CLOSE_REL(want, ref, 1e-2);
    b.gpu->moe_unpermute_add(gyp, pm, k, gres, gres, gtmp);  // in place on the residual
    EXPECT_EQ(download(*b.gpu, gres), want);
  }
}

TEST(CudaMoe, PermuteWeights) {
  MXT_REQUIRE_GPU();
  Backends b;
  for (int64_t n : {1, 74, 777, 65536}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    std::vector<int32_t> perm = random_perm(n, 700 + static_cast<uint32_t>(n));
    std::vector<float> w = randn(n, 701), wp_ref(n), dwp = randn(n, 702), dw_ref(n);
    b.cpu->moe_permute_weights(host(w, {n}), host_i32(perm, {n}), host(wp_ref, {n}));
    b.cpu->moe_unpermute_weights(host(dwp, {n}), host_i32(perm, {n}), host(dw_ref, {n}));
    DeviceTensor pm = upload_i32(*b.gpu, perm, {n}), gw = upload(*b.gpu, w, DType::F32, {n}),
                 gdwp = upload(*b.gpu, dwp, DType::F32, {n});
    DeviceTensor gwp = upload(*b.gpu, randn(n, 703), DType::F32, {n}), gdw = upload(*b.gpu, randn(n, 704), DType::F32, {n});
    b.gpu->moe_permute_weights(gw, pm, gwp);
    b.gpu->moe_unpermute_weights(gdwp, pm, gdw);
    EXPECT_EQ(download(*b.gpu, gwp), wp_ref);
    EXPECT_EQ(download(*b.gpu, gdw), dw_ref);
  }
}

// ---- SwiGLU ---------------------------------------------------------------------------------------------

TEST(CudaMoe, SwigluForwardBackward) {
  MXT_REQUIRE_GPU();
  Backends b;
  struct Case {
    int64_t R, f;
  };
  // f % 8 == 0 takes the 16-byte vector kernels, the others the scalar ones.
  const Case cases[] = {{37, 64}, {100, 333}, {1, 1}, {8, 1408}, {3, 8}, {50, 4096}};
  uint32_t seed = 800;
  for (const auto& c : cases) {
    SCOPED_TRACE("R=" + std::to_string(c.R) + " f=" + std::to_string(c.f));
    const int64_t R = c.R, f = c.f;
    std::vector<float> h13 = randn(R * 2 * f, seed++, 2.f), da = randn(R * f, seed++);
    round_bf16(h13);
    round_bf16(da);
    std::vector<float> wp(R);
    std::mt19937 rng(seed++);
    std::uniform_real_distribution<float> uw(0.05f, 1.f);
    for (auto& w : wp) w = uw(rng);  // routing weights: F32 on both sides, not rounded

    std::vector<float> a_ref(R * f), dh_ref(R * 2 * f), dwp_ref(R);
    b.cpu->swiglu_forward(host(h13, {R, 2 * f}), host(wp, {R}), host(a_ref, {R, f}));
    b.cpu->swiglu_backward(host(da, {R, f}), host(h13, {R, 2 * f}), host(wp, {R}), host(dh_ref, {R, 2 * f}),
                           host(dwp_ref, {R}));

    DeviceTensor gh = upload(*b.gpu, h13, DType::BF16, {R, 2 * f}), gw = upload(*b.gpu, wp, DType::F32, {R}),
                 gda = upload(*b.gpu, da, DType::BF16, {R, f});
    DeviceTensor ga(*b.gpu, DType::BF16, {R, f}), gdh(*b.gpu, DType::BF16, {R, 2 * f});
    DeviceTensor gdwp = upload(*b.gpu, randn(R, seed++), DType::F32, {R});  // stale values to overwrite
    b.gpu->swiglu_forward(gh, gw, ga);
    b.gpu->swiglu_backward(gda, gh, gw, gdh, gdwp);
    // bf16 outputs (one rounding): ~2e-3.
    EXPECT_CLOSE_REL(download(*b.gpu, ga), a_ref, 1e-2);
    EXPECT_CLOSE_REL(download(*b.gpu, gdh), dh_ref, 1e-2);
    // dwp is F32 from identical inputs; only the fp32-vs-fp64 summation order differs. 1e-4 leaves room for
    // cancellation in rows whose terms nearly cancel while still catching any real error.
    EXPECT_CLOSE_REL(download(*b.gpu, gdwp), dwp_ref, 1e-4);
  }
}

}  // namespace
}  // namespace mxt::testing
