// CudaOps::attention_forward / attention_backward against the CPU twin, on bf16-rounded inputs.
//
// Tolerances:
//  - out (bf16): relative L2 <= 1e-2. P is rounded to bf16 for the P V product and out to bf16 on store.
//  - lse (fp32): relative L2 <= 1e-3 and max |diff| <= 1e-3. The scores are exact products of bf16 inputs
//    summed in fp32 in another order; only the summation order and exp2/log2 approximations differ.
//  - dq, dk, dv (bf16): relative L2 <= 1e-2 (seen on an H200: ~2.4e-3 for every shape here). P and
//    dS = P * (dP - delta) are rounded to bf16 before the dS K, dS^T Q and P^T dO tensor-core products (the
//    flash-attention recipe), besides the bf16 outputs. Where the reference is exactly zero (S = 1), see
//    expect_grad_close.
//  The backward is fed the CPU twin's own out (rounded to bf16) and lse, so it is tested on its own.
// Determinism: the backward is run twice and must give bitwise-identical dq, dk, dv.
// Document masks (AttnShape::doc_ids, packed rows): the same comparisons against the CPU twin given the same ids,
// for short, long, tile-aligned and single-token documents. Head dims 64 and 128 run the flash kernels by
// default; the *Reference* and *Variant1* tests run the same cases through MXTRAIN_ATTENTION=reference and
// MXTRAIN_ATTENTION_VARIANT=1 (with the mma.sync forward forced where the Hopper one would apply), *Wgmma* the
// Hopper forward and backward kernels, and *DqFromDsTiles* dQ from the dK/dV kernel's dS tiles (the default on
// Hopper where it applies), so every kernel the dispatch can pick is checked.
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.hpp"

namespace mxt::testing {
namespace {

// Document layouts of packed rows (AttnShape::doc_ids).
enum class Docs { None, Short, Long, Mixed, TileAligned, SingleTokens };

struct Case {
  int64_t B, S, H, KVH, D;
  float in_scale;  // std of q and k; larger makes the softmax peakier
  Docs docs = Docs::None;
};

std::string name(const Case& c) {
  return "B" + std::to_string(c.B) + "_S" + std::to_string(c.S) + "_H" + std::to_string(c.H) + "_KVH" +
         std::to_string(c.KVH) + "_D" + std::to_string(c.D) +
         (c.docs == Docs::None ? "" : "_docs" + std::to_string(static_cast<int>(c.docs)));
}

// Document ids of every token: contiguous runs per batch row, ids restarting differently in each row.
// Short: 1-40 tokens; Long: 60-310; Mixed: some 1-5, most 30-230; TileAligned: lengths around the tile sizes
// (32, 63, 64, 65, 127, 128, 129), so boundaries fall on and next to tile edges; SingleTokens: every token alone.
std::vector<int32_t> make_docs(const Case& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> doc(static_cast<size_t>(c.B * c.S));
  for (int64_t b = 0; b < c.B; ++b) {
    int32_t id = static_cast<int32_t>(3 * b);
    for (int64_t s = 0; s < c.S;) {
      int64_t len = 1;
      switch (c.docs) {
        case Docs::Short: len = 1 + rng() % 40; break;
        case Docs::Long: len = 60 + rng() % 250; break;
        case Docs::Mixed: len = rng() % 3 == 0 ? 1 + rng() % 5 : 30 + rng() % 200; break;
        case Docs::TileAligned: {
          const int64_t L[] = {32, 63, 64, 65, 127, 128, 129};
          len = L[rng() % 7];
          break;
        }
        case Docs::SingleTokens:
        case Docs::None: len = 1; break;
      }
      for (int64_t i = 0; i < len && s < c.S; ++i, ++s) doc[static_cast<size_t>(b * c.S + s)] = id;
      ++id;
    }
  }
  return doc;
}

std::vector<float> rounded_randn(size_t n, uint32_t seed, float scale) {
  auto v = randn(n, seed, scale);
  round_bf16(v);
  return v;
}

// Refills a device bf16 tensor with other values (the op under test must overwrite them).
void overwrite_bf16(Ops& o, const DeviceTensor& d, const std::vector<float>& host_vals) {
  std::vector<uint16_t> b(host_vals.size());
  for (size_t i = 0; i < b.size(); ++i) b[i] = f32_to_bf16_bits(host_vals[i]);
  o.upload(d.t.data, b.data(), b.size() * 2);
}

// Gradients: relative L2 <= 1e-2. A reference that is exactly zero (S = 1: the lone key has P = 1, so
// dS = dP - delta = 0 and dq = dk = 0) makes the relative error meaningless; there the GPU's result is only
// rounding noise of dP - delta (two fp32 dot products summed in different orders) and must be tiny.
void expect_grad_close(const std::vector<float>& got, const std::vector<float>& ref, const char* what) {
  double ref_sq = 0;
  for (float x : ref) ref_sq += double(x) * x;
  if (ref_sq == 0.0) {
    EXPECT_LT(max_abs_diff(got, ref), 1e-4) << what << ": reference is all zeros";
  } else {
    const double r = rel_l2(got, ref);
    EXPECT_LT(r, 1e-2) << what << ": relative L2 error " << r;
  }
}

void run_case(const Case& c, uint32_t seed) {
  SCOPED_TRACE(name(c));
  auto gpu = make_cuda_ops();
  auto cpu = make_cpu_ops();
  AttnShape s{c.B, c.S, c.H, c.KVH, c.D, {}};
  AttnShape s_cpu = s;
  const int64_t T = c.B * c.S;
  std::vector<int32_t> docs;
  std::optional<DeviceTensor> g_docs;
  if (c.docs != Docs::None) {
    docs = make_docs(c, seed + 13);
    g_docs.emplace(upload_i32(*gpu, docs, {T}));
    s.doc_ids = g_docs->t;
    s_cpu.doc_ids = host_i32(docs, {T});
  }
  const size_t nq = static_cast<size_t>(T * c.H * c.D), nkv = static_cast<size_t>(T * c.KVH * c.D);
  const size_t nl = static_cast<size_t>(c.B * c.H * c.S);

  auto q = rounded_randn(nq, seed + 1, c.in_scale);
  auto k = rounded_randn(nkv, seed + 2, c.in_scale);
  auto v = rounded_randn(nkv, seed + 3, 1.f);
  auto dout = rounded_randn(nq, seed + 4, 1.f);

  // ---- forward ----
  std::vector<float> out_ref(nq), lse_ref(nl);
  cpu->attention_forward(s_cpu, host(q, {T, c.H, c.D}), host(k, {T, c.KVH, c.D}), host(v, {T, c.KVH, c.D}),
                         host(out_ref, {T, c.H, c.D}), host(lse_ref, {c.B, c.H, c.S}));

  auto dq_ = upload(*gpu, q, DType::BF16, {T, c.H, c.D});
  auto dk_ = upload(*gpu, k, DType::BF16, {T, c.KVH, c.D});
  auto dv_ = upload(*gpu, v, DType::BF16, {T, c.KVH, c.D});
  // Outputs start as garbage: the op must overwrite every element.
  auto dout_ = upload(*gpu, rounded_randn(nq, seed + 5, 100.f), DType::BF16, {T, c.H, c.D});
  auto dlse_ = upload(*gpu, randn(nl, seed + 6, 100.f), DType::F32, {c.B, c.H, c.S});
  gpu->attention_forward(s, dq_, dk_, dv_, dout_, dlse_);
  const auto out = download(*gpu, dout_);
  const auto lse = download(*gpu, dlse_);
  EXPECT_CLOSE_REL(out, out_ref, 1e-2);
  EXPECT_CLOSE_REL(lse, lse_ref, 1e-3);
  EXPECT_LT(max_abs_diff(lse, lse_ref), 1e-3);

  // ---- backward, fed the reference out (bf16-rounded) and lse ----
  auto out_b = out_ref;
  round_bf16(out_b);
  std::vector<float> dq_ref(nq), dk_ref(nkv), dv_ref(nkv);
  cpu->attention_backward(s_cpu, host(dout, {T, c.H, c.D}), host(q, {T, c.H, c.D}), host(k, {T, c.KVH, c.D}),
                          host(v, {T, c.KVH, c.D}), host(out_b, {T, c.H, c.D}), host(lse_ref, {c.B, c.H, c.S}),
                          host(dq_ref, {T, c.H, c.D}), host(dk_ref, {T, c.KVH, c.D}),
                          host(dv_ref, {T, c.KVH, c.D}));

  auto g_dout = upload(*gpu, dout, DType::BF16, {T, c.H, c.D});
  auto g_out = upload(*gpu, out_b, DType::BF16, {T, c.H, c.D});
  auto g_lse = upload(*gpu, lse_ref, DType::F32, {c.B, c.H, c.S});
  auto g_dq = upload(*gpu, rounded_randn(nq, seed + 7, 100.f), DType::BF16, {T, c.H, c.D});
  auto g_dk = upload(*gpu, rounded_randn(nkv, seed + 8, 100.f), DType::BF16, {T, c.KVH, c.D});
  auto g_dv = upload(*gpu, rounded_randn(nkv, seed + 9, 100.f), DType::BF16, {T, c.KVH, c.D});
  gpu->attention_backward(s, g_dout, dq_, dk_, dv_, g_out, g_lse, g_dq, g_dk, g_dv);
  const auto dq1 = download(*gpu, g_dq);
  const auto dk1 = download(*gpu, g_dk);
  const auto dv1 = download(*gpu, g_dv);
  std::printf("[attention %s] rel L2: out %.2e lse %.2e (max abs %.2e) dq %.2e dk %.2e dv %.2e"
              " (max abs: dq %.2e dk %.2e)\n",
              name(c).c_str(), rel_l2(out, out_ref), rel_l2(lse, lse_ref), max_abs_diff(lse, lse_ref),
              rel_l2(dq1, dq_ref), rel_l2(dk1, dk_ref), rel_l2(dv1, dv_ref), max_abs_diff(dq1, dq_ref),
              max_abs_diff(dk1, dk_ref));
  expect_grad_close(dq1, dq_ref, "dq");
  expect_grad_close(dk1, dk_ref, "dk");
  expect_grad_close(dv1, dv_ref, "dv");

  // Determinism: a second run (outputs reset to other garbage first) gives the same bits.
  overwrite_bf16(*gpu, g_dq, rounded_randn(nq, seed + 10, 50.f));
  overwrite_bf16(*gpu, g_dk, rounded_randn(nkv, seed + 11, 50.f));
  overwrite_bf16(*gpu, g_dv, rounded_randn(nkv, seed + 12, 50.f));
  gpu->attention_backward(s, g_dout, dq_, dk_, dv_, g_out, g_lse, g_dq, g_dk, g_dv);
  const auto dq2 = download(*gpu, g_dq);
  const auto dk2 = download(*gpu, g_dk);
  const auto dv2 = download(*gpu, g_dv);
  EXPECT_EQ(0, std::memcmp(dq1.data(), dq2.data(), dq1.size() * sizeof(float))) << "dq not deterministic";
  EXPECT_EQ(0, std::memcmp(dk1.data(), dk2.data(), dk1.size() * sizeof(float))) << "dk not deterministic";
  EXPECT_EQ(0, std::memcmp(dv1.data(), dv2.data(), dv1.size() * sizeof(float))) << "dv not deterministic";
}

// One set of random inputs (q, k, v and dout from seeds seed .. seed + 3, out and lse from the forward) and the
// backward's dq, dk and dv on them with environment `var` set to each of `values` in turn, every run's outputs
// starting as other garbage: for comparing two kernels or schedules bit for bit.
struct BwdShape {
  int64_t B, S, H, KVH, D;
};
std::string name(const BwdShape& c) {
  return "B=" + std::to_string(c.B) + " S=" + std::to_string(c.S) + " H=" + std::to_string(c.H) +
         " KVH=" + std::to_string(c.KVH) + " D=" + std::to_string(c.D);
}
std::vector<std::array<std::vector<float>, 3>> backward_under(const BwdShape& c, const char* var,
                                                              std::initializer_list<const char*> values,
                                                              uint32_t seed) {
  auto gpu = make_cuda_ops();
  const int64_t T = c.B * c.S, D = c.D;
  const AttnShape s{c.B, c.S, c.H, c.KVH, D, {}};
  auto q = upload(*gpu, rounded_randn(T * c.H * D, seed, 1.f), DType::BF16, {T, c.H, D});
  auto k = upload(*gpu, rounded_randn(T * c.KVH * D, seed + 1, 1.f), DType::BF16, {T, c.KVH, D});
  auto v = upload(*gpu, rounded_randn(T * c.KVH * D, seed + 2, 1.f), DType::BF16, {T, c.KVH, D});
  auto dout = upload(*gpu, rounded_randn(T * c.H * D, seed + 3, 1.f), DType::BF16, {T, c.H, D});
  DeviceTensor o(*gpu, DType::BF16, {T, c.H, D}), l(*gpu, DType::F32, {c.B, c.H, c.S});
  gpu->attention_forward(s, q, k, v, o, l);
  std::vector<std::array<std::vector<float>, 3>> grads;
  uint32_t garbage = seed + 4;
  for (const char* value : values) {
    ScopedEnv env(var, value);
    auto g = upload(*gpu, rounded_randn(T * c.H * D, garbage++, 100.f), DType::BF16, {T, c.H, D});
    auto gk = upload(*gpu, rounded_randn(T * c.KVH * D, garbage++, 100.f), DType::BF16, {T, c.KVH, D});
    auto gv = upload(*gpu, rounded_randn(T * c.KVH * D, garbage++, 100.f), DType::BF16, {T, c.KVH, D});
    gpu->attention_backward(s, dout, q, k, v, o, l, g, gk, gv);
    grads.push_back({download(*gpu, g), download(*gpu, gk), download(*gpu, gv)});
  }
  return grads;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(CudaAttention, B2_S128_H4_KVH2_D64) {
  MXT_REQUIRE_GPU();
  run_case({2, 128, 4, 2, 64, 1.f}, 100);
}

TEST(CudaAttention, B1_S300_H8_KVH2_D128) {
  MXT_REQUIRE_GPU();
  run_case({1, 300, 8, 2, 128, 1.f}, 200);
}

TEST(CudaAttention, B3_S7_H2_KVH1_D32) {
  MXT_REQUIRE_GPU();
  run_case({3, 7, 2, 1, 32, 1.f}, 300);
}

TEST(CudaAttention, SeqOne) {
  MXT_REQUIRE_GPU();
  run_case({1, 1, 4, 2, 64, 1.f}, 400);
  run_case({2, 1, 4, 1, 16, 1.f}, 410);
}

TEST(CudaAttention, B1_S1024_H16_KVH8_D64) {
  MXT_REQUIRE_GPU();
  run_case({1, 1024, 16, 8, 64, 1.f}, 500);
}

TEST(CudaAttention, SmallHeadDims) {
  MXT_REQUIRE_GPU();
  run_case({2, 45, 4, 4, 16, 1.f}, 600);   // MHA (group 1), head_dim 16
  run_case({1, 97, 6, 2, 32, 1.f}, 610);   // group 3, crosses tile edges
}

// Peaky softmax (scores with std ~ 9): exercises the online rescaling across many key tiles.
TEST(CudaAttention, PeakyScores) {
  MXT_REQUIRE_GPU();
  run_case({2, 200, 4, 1, 64, 3.f}, 700);
  run_case({1, 130, 2, 2, 128, 3.f}, 710);
}

TEST(CudaAttention, LongSeq4096) {
  MXT_REQUIRE_GPU();
  run_case({1, 4096, 2, 1, 64, 1.f}, 800);
}

// ---- document masks (packed rows) ----

TEST(CudaAttention, DocsShortD64) {
  MXT_REQUIRE_GPU();
  run_case({2, 300, 4, 2, 64, 1.f, Docs::Short}, 900);
}

TEST(CudaAttention, DocsMixedD128) {
  MXT_REQUIRE_GPU();
  run_case({1, 520, 8, 2, 128, 1.f, Docs::Mixed}, 910);
  run_case({2, 200, 4, 4, 128, 3.f, Docs::Mixed}, 915);  // peaky scores, MHA
}

TEST(CudaAttention, DocsTileAligned) {
  MXT_REQUIRE_GPU();
  run_case({1, 700, 4, 1, 64, 1.f, Docs::TileAligned}, 920);
  run_case({2, 512, 4, 2, 128, 1.f, Docs::TileAligned}, 925);
}

TEST(CudaAttention, DocsLongSeq) {
  MXT_REQUIRE_GPU();
  run_case({1, 2048, 2, 1, 128, 1.f, Docs::Long}, 930);
}

// Every token its own document: out = v of the token, lse = its own score.
TEST(CudaAttention, DocsSingleTokens) {
  MXT_REQUIRE_GPU();
  run_case({1, 200, 2, 1, 64, 1.f, Docs::SingleTokens}, 940);
}

TEST(CudaAttention, DocsSmallHeadDims) {  // reference kernels
  MXT_REQUIRE_GPU();
  run_case({2, 150, 4, 2, 32, 1.f, Docs::Mixed}, 950);
  run_case({1, 90, 2, 1, 16, 1.f, Docs::Short}, 955);
}

// ---- the other kernels the dispatch can pick ----

TEST(CudaAttention, ReferenceKernels) {
  MXT_REQUIRE_GPU();
  ScopedEnv env("MXTRAIN_ATTENTION", "reference");
  run_case({1, 300, 8, 2, 128, 1.f}, 1000);
  run_case({2, 200, 4, 1, 64, 1.f, Docs::Mixed}, 1010);
  run_case({1, 400, 4, 2, 128, 1.f, Docs::TileAligned}, 1020);
}

TEST(CudaAttention, Variant1Kernels) {
  MXT_REQUIRE_GPU();
  ScopedEnv env("MXTRAIN_ATTENTION_VARIANT", "1"), fwd("MXTRAIN_ATTENTION_FWD", "mma");
  ScopedEnv dkv("MXTRAIN_ATTENTION_DKV", "mma"), dq("MXTRAIN_ATTENTION_DQ", "mma");
  run_case({2, 128, 4, 2, 64, 1.f}, 1100);
  run_case({1, 300, 8, 2, 128, 1.f}, 1110);
  run_case({1, 1, 4, 2, 64, 1.f}, 1115);
  run_case({2, 200, 4, 1, 64, 3.f, Docs::Mixed}, 1120);
  run_case({1, 520, 4, 2, 128, 1.f, Docs::TileAligned}, 1130);
  run_case({1, 2048, 4, 2, 128, 1.f}, 1140);
}

// The Hopper wgmma kernels (attention_fwd_sm90.cu, attention_dkv_sm90.cu, attention_dq_sm90.cu), required here (an
// error if they did not apply): GQA groups of 1, 2 and 4, two batch rows, a peaky softmax, the smallest seq; then
// each backward kernel beside the other's mma.sync kernel, then the mma.sync kernels forced on the same kind of
// shape.
TEST(CudaAttention, WgmmaBackwardKernels) {
  MXT_REQUIRE_SM90();
  {
    ScopedEnv fwd("MXTRAIN_ATTENTION_FWD", "wgmma");
    ScopedEnv dkv("MXTRAIN_ATTENTION_DKV", "wgmma"), dq("MXTRAIN_ATTENTION_DQ", "wgmma");
    run_case({1, 256, 4, 2, 128, 1.f}, 1300);
    run_case({2, 384, 8, 2, 128, 1.f}, 1310);
    run_case({1, 1024, 4, 4, 128, 1.f}, 1320);
    run_case({1, 512, 8, 2, 128, 3.f}, 1330);
    run_case({1, 128, 4, 1, 128, 1.f}, 1340);
  }
  {
    ScopedEnv dkv("MXTRAIN_ATTENTION_DKV", "wgmma"), dq("MXTRAIN_ATTENTION_DQ", "mma");
    run_case({1, 384, 4, 2, 128, 1.f}, 1345);
  }
  {
    ScopedEnv dkv("MXTRAIN_ATTENTION_DKV", "mma"), dq("MXTRAIN_ATTENTION_DQ", "wgmma");
    run_case({1, 384, 4, 2, 128, 1.f}, 1346);
  }
  ScopedEnv fwd("MXTRAIN_ATTENTION_FWD", "mma");
  ScopedEnv dkv("MXTRAIN_ATTENTION_DKV", "mma"), dq("MXTRAIN_ATTENTION_DQ", "mma");
  run_case({1, 512, 4, 2, 128, 1.f}, 1350);
  run_case({1, 512, 4, 2, 64, 1.f}, 1355);
}

// The forward's ping-pong schedule (MXTRAIN_ATTENTION_FWD_SCHED=pingpong) at 64 keys per step against the CPU
// twin, and bit for bit against the serial wgmma kernel: the same arithmetic in the same order. Seq 128 gives
// warpgroup 0 a single active step of two; 4096 wraps the stage ring many times.
TEST(CudaAttention, WgmmaForwardPingPong) {
  MXT_REQUIRE_SM90();
  ScopedEnv fwd("MXTRAIN_ATTENTION_FWD", "wgmma"), keys("MXTRAIN_ATTENTION_FWD_KEYS", "64");
  {
    ScopedEnv sched("MXTRAIN_ATTENTION_FWD_SCHED", "pingpong");
    run_case({1, 256, 4, 2, 128, 1.f}, 1500);
    run_case({2, 384, 8, 2, 128, 3.f}, 1510);
    run_case({1, 128, 4, 1, 128, 1.f}, 1520);
  }
  struct Shape { int64_t B, S, H, KVH; };
  for (const Shape c : {Shape{1, 128, 2, 1}, Shape{2, 640, 4, 2}, Shape{1, 4096, 2, 2}}) {
    SCOPED_TRACE("B=" + std::to_string(c.B) + " S=" + std::to_string(c.S) + " H=" + std::to_string(c.H));
    auto gpu = make_cuda_ops();
    const int64_t T = c.B * c.S, D = 128;
    const AttnShape s{c.B, c.S, c.H, c.KVH, D, {}};
    auto q = upload(*gpu, rounded_randn(T * c.H * D, 1530, 1.f), DType::BF16, {T, c.H, D});
    auto k = upload(*gpu, rounded_randn(T * c.KVH * D, 1531, 1.f), DType::BF16, {T, c.KVH, D});
    auto v = upload(*gpu, rounded_randn(T * c.KVH * D, 1532, 1.f), DType::BF16, {T, c.KVH, D});
    std::vector<float> out[2], lse[2];
    for (int pp = 0; pp < 2; ++pp) {
      ScopedEnv sched("MXTRAIN_ATTENTION_FWD_SCHED", pp ? "pingpong" : "serial");
      auto o = upload(*gpu, rounded_randn(T * c.H * D, 1533 + pp, 100.f), DType::BF16, {T, c.H, D});
      auto l = upload(*gpu, randn(c.B * c.H * c.S, 1535 + pp, 100.f), DType::F32, {c.B, c.H, c.S});
      gpu->attention_forward(s, q, k, v, o, l);
      out[pp] = download(*gpu, o);
      lse[pp] = download(*gpu, l);
    }
    EXPECT_EQ(0, std::memcmp(out[0].data(), out[1].data(), out[0].size() * 4)) << "out differs";
    EXPECT_EQ(0, std::memcmp(lse[0].data(), lse[1].data(), lse[0].size() * 4)) << "lse differs";
  }
  ScopedEnv bad("MXTRAIN_ATTENTION_FWD_SCHED", "fast");
  auto gpu = make_cuda_ops();
  auto q = upload(*gpu, rounded_randn(128 * 128, 1540, 1.f), DType::BF16, {128, 1, 128});
  DeviceTensor o(*gpu, DType::BF16, {128, 1, 128}), l(*gpu, DType::F32, {1, 1, 128});
  try {
    gpu->attention_forward(AttnShape{1, 128, 1, 1, 128, {}}, q, q, q, o, l);
    FAIL() << "MXTRAIN_ATTENTION_FWD_SCHED=fast accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("MXTRAIN_ATTENTION_FWD_SCHED=fast"), std::string::npos) << e.what();
  }
}

// The forward over 128 keys per step (MXTRAIN_ATTENTION_FWD_KEYS=128, the default), with a ring of 2 and of 3
// stages: against the CPU twin, then against the 64-key kernel (another order of the same sums: lse to fp32
// rounding, out to a bf16 step or two). Seq 128 is one diagonal step; 640 wraps the 2- and 3-stage rings; 4096
// runs 32 steps.
TEST(CudaAttention, WgmmaForward128Keys) {
  MXT_REQUIRE_SM90();
  ScopedEnv fwd("MXTRAIN_ATTENTION_FWD", "wgmma");
  for (const char* stages : {"2", "3"}) {
    SCOPED_TRACE(std::string("stages ") + stages);
    ScopedEnv keys("MXTRAIN_ATTENTION_FWD_KEYS", "128"), ring("MXTRAIN_ATTENTION_FWD_STAGES", stages);
    run_case({1, 128, 4, 1, 128, 1.f}, 1600);
    run_case({2, 384, 8, 2, 128, 3.f}, 1610);
    run_case({1, 640, 4, 4, 128, 1.f}, 1620);
  }
  struct Shape { int64_t B, S, H, KVH; };
  for (const Shape c : {Shape{1, 128, 2, 1}, Shape{2, 640, 4, 2}, Shape{1, 4096, 2, 2}}) {
    SCOPED_TRACE("B=" + std::to_string(c.B) + " S=" + std::to_string(c.S) + " H=" + std::to_string(c.H));
    auto gpu = make_cuda_ops();
    const int64_t T = c.B * c.S, D = 128;
    const AttnShape s{c.B, c.S, c.H, c.KVH, D, {}};
    auto q = upload(*gpu, rounded_randn(T * c.H * D, 1630, 1.f), DType::BF16, {T, c.H, D});
    auto k = upload(*gpu, rounded_randn(T * c.KVH * D, 1631, 1.f), DType::BF16, {T, c.KVH, D});
    auto v = upload(*gpu, rounded_randn(T * c.KVH * D, 1632, 1.f), DType::BF16, {T, c.KVH, D});
    std::vector<float> out[3], lse[3];
    const char* setting[3][2] = {{"64", "3"}, {"128", "3"}, {"128", "2"}};
    for (int i = 0; i < 3; ++i) {
      ScopedEnv keys("MXTRAIN_ATTENTION_FWD_KEYS", setting[i][0]);
      ScopedEnv ring("MXTRAIN_ATTENTION_FWD_STAGES", setting[i][1]);
      auto o = upload(*gpu, rounded_randn(T * c.H * D, 1633 + i, 100.f), DType::BF16, {T, c.H, D});
      auto l = upload(*gpu, randn(c.B * c.H * c.S, 1636 + i, 100.f), DType::F32, {c.B, c.H, c.S});
      gpu->attention_forward(s, q, k, v, o, l);
      out[i] = download(*gpu, o);
      lse[i] = download(*gpu, l);
    }
    for (int i = 1; i < 3; ++i) {
      EXPECT_LT(max_abs_diff(out[i], out[0]), 2e-2) << setting[i][0] << " keys, " << setting[i][1] << " stages";
      EXPECT_LT(max_abs_diff(lse[i], lse[0]), 1e-4) << setting[i][0] << " keys, " << setting[i][1] << " stages";
    }
    // The ring's depth changes only when tiles arrive, not the arithmetic.
    EXPECT_EQ(0, std::memcmp(out[1].data(), out[2].data(), out[1].size() * 4)) << "2 and 3 stages differ";
  }
  auto gpu = make_cuda_ops();
  auto q = upload(*gpu, rounded_randn(128 * 128, 1640, 1.f), DType::BF16, {128, 1, 128});
  DeviceTensor o(*gpu, DType::BF16, {128, 1, 128}), l(*gpu, DType::F32, {1, 1, 128});
  // Unset, the serial schedule takes its own 64 keys; asked for 128, it is an error.
  {
    ScopedEnv keys("MXTRAIN_ATTENTION_FWD_KEYS", ""), sched("MXTRAIN_ATTENTION_FWD_SCHED", "serial");
    EXPECT_NO_THROW(gpu->attention_forward(AttnShape{1, 128, 1, 1, 128, {}}, q, q, q, o, l));
  }
  const char* bad[][3] = {{"96", "3", "pingpong"}, {"128", "4", "pingpong"}, {"128", "3", "serial"}};
  for (const auto& b : bad) {
    ScopedEnv keys("MXTRAIN_ATTENTION_FWD_KEYS", b[0]), ring("MXTRAIN_ATTENTION_FWD_STAGES", b[1]);
    ScopedEnv sched("MXTRAIN_ATTENTION_FWD_SCHED", b[2]);
    try {
      gpu->attention_forward(AttnShape{1, 128, 1, 1, 128, {}}, q, q, q, o, l);
      ADD_FAILURE() << "accepted keys " << b[0] << ", stages " << b[1] << ", " << b[2];
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("MXTRAIN_ATTENTION_FWD_"), std::string::npos) << e.what();
    }
  }
}

// The dQ kernel's ping-pong schedule (MXTRAIN_ATTENTION_DQ_SCHED=pingpong): against the CPU twin, and dQ bit for
// bit against the serial kernel's.
TEST(CudaAttention, WgmmaDqPingPong) {
  MXT_REQUIRE_SM90();
  ScopedEnv dq_impl("MXTRAIN_ATTENTION_DQ", "wgmma");
  {
    ScopedEnv sched("MXTRAIN_ATTENTION_DQ_SCHED", "pingpong");
    run_case({1, 256, 4, 2, 128, 1.f}, 1600);
    run_case({2, 384, 8, 2, 128, 3.f}, 1610);
    run_case({1, 128, 4, 1, 128, 1.f}, 1620);
  }
  for (const BwdShape c : {BwdShape{1, 128, 2, 1, 128}, BwdShape{2, 640, 4, 2, 128}, BwdShape{1, 2048, 2, 2, 128}}) {
    SCOPED_TRACE(name(c));
    const auto g = backward_under(c, "MXTRAIN_ATTENTION_DQ_SCHED", {"serial", "pingpong"}, 1630);
    EXPECT_TRUE(same_bits(g[0][0], g[1][0])) << "dq differs";
  }
}

// Required but not applicable (seq not a multiple of 128): an error naming why, not a silent fallback.
TEST(CudaAttention, WgmmaRequiredWhereItDoesNotApply) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  const AttnShape s{1, 300, 4, 2, 128, {}};
  DeviceTensor q = upload(*gpu, rounded_randn(300 * 4 * 128, 1400, 1.f), DType::BF16, {300, 4, 128}),
               k = upload(*gpu, rounded_randn(300 * 2 * 128, 1401, 1.f), DType::BF16, {300, 2, 128}),
               v = upload(*gpu, rounded_randn(300 * 2 * 128, 1402, 1.f), DType::BF16, {300, 2, 128});
  DeviceTensor o(*gpu, DType::BF16, {300, 4, 128}), l(*gpu, DType::F32, {1, 4, 300}),
      dq(*gpu, DType::BF16, {300, 4, 128}), dk(*gpu, DType::BF16, {300, 2, 128}), dv(*gpu, DType::BF16, {300, 2, 128});
  {
    ScopedEnv env("MXTRAIN_ATTENTION_FWD", "wgmma");
    try {
      gpu->attention_forward(s, q, k, v, o, l);
      FAIL() << "no error";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("seq 300"), std::string::npos) << e.what();
    }
  }
  gpu->attention_forward(s, q, k, v, o, l);
  const char* required[][2] = {
      {"MXTRAIN_ATTENTION_DKV", "wgmma"}, {"MXTRAIN_ATTENTION_DQ", "wgmma"}, {"MXTRAIN_ATTENTION_DS", "on"}};
  for (const auto& [var, value] : required) {
    SCOPED_TRACE(var);
    ScopedEnv env(var, value);
    try {
      gpu->attention_backward(s, o, q, k, v, o, l, dq, dk, dv);
      FAIL() << "no error";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("seq 300"), std::string::npos) << e.what();
    }
  }
}

// dQ from the dK/dV kernel's dS tiles (MXTRAIN_ATTENTION_DS=on), head_dim 128 and 64: against the CPU twin over
// GQA groups of 1, 2 and 4, two batch rows, a peaky softmax and the smallest seq; then beside the recomputing dQ
// kernel on the same inputs. dK and dV bit for bit (the dK/dV kernel only adds the tiles' stores); at head_dim 128
// dQ too: the tiles' dS (from S^T = K Q^T) and the wgmma recomputing kernel's (from S = Q K^T) come from the same
// bf16 products, are rounded to bf16 the same way and enter dQ in the same key order (equal on the H200 in
// session 50); at 64 the recomputing dQ kernel is the mma.sync one, so dQ agrees to its rounding.
TEST(CudaAttention, DqFromDsTiles) {
  MXT_REQUIRE_SM90();
  {
    ScopedEnv ds("MXTRAIN_ATTENTION_DS", "on");
    for (const int64_t d : {128, 64}) {
      run_case({1, 256, 4, 2, d, 1.f}, 1700);
      run_case({2, 384, 8, 2, d, 1.f}, 1710);
      run_case({1, 1024, 4, 4, d, 1.f}, 1720);
      run_case({1, 512, 8, 2, d, 3.f}, 1730);
      run_case({1, 128, 4, 1, d, 1.f}, 1740);
    }
  }
  for (const BwdShape c : {BwdShape{1, 128, 2, 1, 128}, BwdShape{2, 640, 4, 2, 128}, BwdShape{1, 2048, 8, 2, 128},
                           BwdShape{1, 128, 2, 1, 64}, BwdShape{2, 640, 4, 2, 64}, BwdShape{1, 2048, 8, 2, 64}}) {
    SCOPED_TRACE(name(c));
    const auto g = backward_under(c, "MXTRAIN_ATTENTION_DS", {"off", "on"}, 1750);
    EXPECT_TRUE(same_bits(g[0][1], g[1][1])) << "dk differs";
    EXPECT_TRUE(same_bits(g[0][2], g[1][2])) << "dv differs";
    const double r = rel_l2(g[1][0], g[0][0]);
    std::printf("[attention dS tiles %s] dq rel L2 against the recomputing kernel %.2e\n", name(c).c_str(), r);
    if (c.D == 128) EXPECT_TRUE(same_bits(g[0][0], g[1][0])) << "dq differs";
    else EXPECT_LT(r, 5e-3);
  }
}

TEST(CudaAttention, LongSeq4096D128) {
  MXT_REQUIRE_GPU();
  run_case({1, 4096, 2, 1, 128, 1.f}, 1200);
}

TEST(CudaAttention, RejectsBadDocIds) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  AttnShape s{1, 8, 2, 2, 64, {}};
  DeviceTensor q(*gpu, DType::BF16, {8, 2, 64}), k(*gpu, DType::BF16, {8, 2, 64}), v(*gpu, DType::BF16, {8, 2, 64}),
      o(*gpu, DType::BF16, {8, 2, 64}), l(*gpu, DType::F32, {1, 2, 8});
  DeviceTensor short_ids(*gpu, DType::I32, {7}), f32_ids(*gpu, DType::F32, {8});
  s.doc_ids = short_ids.t;
  try {
    gpu->attention_forward(s, q, k, v, o, l);
    FAIL() << "doc_ids of 7 elements accepted for 8 tokens";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("doc_ids"), std::string::npos) << e.what();
  }
  s.doc_ids = f32_ids.t;
  try {
    gpu->attention_backward(s, o, q, k, v, o, l, q, k, v);
    FAIL() << "f32 doc_ids accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("doc_ids"), std::string::npos) << e.what();
  }
}

TEST(CudaAttention, RejectsBadEnvironment) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  const AttnShape s{1, 4, 2, 2, 64, {}};
  DeviceTensor q(*gpu, DType::BF16, {4, 2, 64}), k(*gpu, DType::BF16, {4, 2, 64}), v(*gpu, DType::BF16, {4, 2, 64}),
      o(*gpu, DType::BF16, {4, 2, 64}), l(*gpu, DType::F32, {1, 2, 4});
  // var=value must be refused by the call, with an error naming both.
  auto rejected = [](const char* var, const char* value, const std::function<void()>& call) {
    const std::string setting = std::string(var) + "=" + value;
    ScopedEnv env(var, value);
    try {
      call();
      FAIL() << setting << " accepted";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(setting), std::string::npos) << e.what();
    }
  };
  auto forward = [&] { gpu->attention_forward(s, q, k, v, o, l); };
  auto backward = [&] { gpu->attention_backward(s, o, q, k, v, o, l, q, k, v); };
  rejected("MXTRAIN_ATTENTION", "fast", forward);
  rejected("MXTRAIN_ATTENTION_VARIANT", "7", backward);
  rejected("MXTRAIN_ATTENTION_DS", "fast", backward);
}

TEST(CudaAttention, RejectsUnsupportedHeadDim) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  const AttnShape s{1, 4, 2, 2, 96, {}};
  DeviceTensor q(*gpu, DType::BF16, {4, 2, 96}), k(*gpu, DType::BF16, {4, 2, 96}),
      v(*gpu, DType::BF16, {4, 2, 96}), o(*gpu, DType::BF16, {4, 2, 96}), l(*gpu, DType::F32, {1, 2, 4});
  try {
    gpu->attention_forward(s, q, k, v, o, l);
    FAIL() << "head_dim 96 was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("head_dim 96"), std::string::npos) << e.what();
  }
  try {
    gpu->attention_backward(s, o, q, k, v, o, l, q, k, v);
    FAIL() << "head_dim 96 was accepted by the backward";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("head_dim 96"), std::string::npos) << e.what();
  }
}

TEST(CudaAttention, RejectsWrongDtype) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  const AttnShape s{1, 4, 2, 2, 64, {}};
  DeviceTensor q(*gpu, DType::F32, {4, 2, 64}), k(*gpu, DType::BF16, {4, 2, 64}), v(*gpu, DType::BF16, {4, 2, 64}),
      o(*gpu, DType::BF16, {4, 2, 64}), l(*gpu, DType::F32, {1, 2, 4});
  EXPECT_THROW(gpu->attention_forward(s, q, k, v, o, l), std::runtime_error);
}

}  // namespace
}  // namespace mxt::testing
