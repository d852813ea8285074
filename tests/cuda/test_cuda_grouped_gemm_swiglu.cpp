// The Hopper forward fused with SwiGLU x routing weight (CudaOps::grouped_gemm_swiglu: one tile holds BN/2 gate
// and BN/2 up columns of W13, the epilogue writes h13 and act) and the dgrad through W2 fused with the SwiGLU
// backward (grouped_gemm_dgrad_swiglu: dh13 from the registers, dwp from per-tile partials) against the two ops
// each replaces and the CPU twin. Backward: dh13 bit for bit the unfused pair's, dwp within fp32 summation order
// (1e-5) of it and bit for bit run to run; forward:
//   h13: bit for bit the unfused sm90 forward's (the same k-order per element; only the column placement in the
//        tile differs), and within bf16 rounding (rel L2 1e-2) of the CPU;
//   act: bit for bit swiglu_forward of that h13 (the epilogue rounds gate and up to bf16 first, then the same
//        arithmetic), within 1e-2 of the CPU;
//   rows past offsets[E]: zero in both outputs (prefilled with NaN; NaN in x's padding rows too).
// Shapes: f not a multiple of the tile's BN/2 (the gate half then loads up rows, the up half zero-fills), uneven
// and empty experts, loads on and off the 128-row tile, more work items than SMs; both tile widths and both
// epilogues (TMA stores, direct stores); the fusion forced on (it is off by default). Skips without a GPU, and (with a note) on a GPU that is not sm_90.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "cuda_test_util.hpp"
#include "sm90_grouped_gemm.cuh"

namespace mxt::testing {
namespace {

constexpr double kTolBf16 = 1e-2;

struct Guard {
  ~Guard() {
    sm90::set_grouped_impl(sm90::GroupedImpl::Auto);
    sm90::set_grouped_tile_n(0);
    sm90::set_grouped_tma_store(-1);
    sm90::set_grouped_swiglu_fusion(-1);
    sm90::set_grouped_tail_split(-1);
  }
};

struct Case {
  int64_t in, f;
  std::vector<int32_t> loads;
  int64_t padding;
};

struct Result {
  std::vector<float> h13, act;
  std::string impl;
};

// Elements whose bits differ, a zero's sign aside (the separate kernels make -0 in padding rows, e.g. act =
// 0 * ... * wp with wp < 0, where the fused kernels store +0).
int64_t bit_mismatches(const std::vector<float>& a, const std::vector<float>& b) {
  int64_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], 4) != 0 && !(a[i] == 0.f && b[i] == 0.f);
  return n;
}

void check(Ops& gpu, Ops& cpu, const Case& c, int bn, int tma_store, uint32_t seed) {
  SCOPED_TRACE("in=" + std::to_string(c.in) + " f=" + std::to_string(c.f) + " BN=" + std::to_string(bn) +
               (tma_store ? " tma" : " direct"));
  Guard guard;
  sm90::set_grouped_tail_split(0);  // the fused kernels never split their last round: the same sums bit for bit
  const int64_t E = static_cast<int64_t>(c.loads.size());
  std::vector<int32_t> off(E + 1, 0);
  for (int64_t e = 0; e < E; ++e) off[e + 1] = off[e] + c.loads[e];
  const int64_t used = off[E], R = used + c.padding, f = c.f;
  auto x = randn(R * c.in, seed);
  auto w13 = randn(E * 2 * f * c.in, seed + 1, 0.1f);
  auto wp = randn(R, seed + 2, 0.5f);
  round_bf16(x);
  round_bf16(w13);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t i = used * c.in; i < R * c.in; ++i) x[i] = nan;  // padding rows must not reach any output

  auto X = upload(gpu, x, DType::BF16, {R, c.in});
  auto W = upload(gpu, w13, DType::BF16, {E, 2 * f, c.in});
  auto WP = upload(gpu, wp, DType::F32, {R});
  auto OFF = upload_i32(gpu, off, {E + 1});
  auto run = [&](bool fused, sm90::GroupedImpl impl) {
    sm90::set_grouped_impl(impl);
    sm90::set_grouped_tile_n(bn);
    sm90::set_grouped_tma_store(tma_store);
    sm90::set_grouped_swiglu_fusion(1);
    auto H = upload(gpu, std::vector<float>(R * 2 * f, nan), DType::BF16, {R, 2 * f});
    auto A = upload(gpu, std::vector<float>(R * f, nan), DType::BF16, {R, f});
    if (fused) {
      gpu.grouped_gemm_swiglu(X, W, OFF, WP, H, A);
    } else {
      gpu.grouped_gemm(X, W, OFF, H);
      gpu.swiglu_forward(H, WP, A);
    }
    Result r{download(gpu, H), download(gpu, A), sm90::last_grouped_impl()};
    return r;
  };
  const Result fz = run(true, sm90::GroupedImpl::Sm90);
  const Result un = run(false, sm90::GroupedImpl::Sm90);
  const Result fb = run(true, sm90::GroupedImpl::Wmma);  // the fallback: the two ops on the wmma kernels
  EXPECT_EQ(fz.impl, "sm90");
  EXPECT_EQ(fb.impl, "wmma");
  {  // fusion off (the default): the op is the two separate ones, bit for bit
    sm90::set_grouped_impl(sm90::GroupedImpl::Sm90);
    sm90::set_grouped_swiglu_fusion(0);
    auto H0 = upload(gpu, std::vector<float>(R * 2 * f, nan), DType::BF16, {R, 2 * f});
    auto A0 = upload(gpu, std::vector<float>(R * f, nan), DType::BF16, {R, f});
    gpu.grouped_gemm_swiglu(X, W, OFF, WP, H0, A0);
    const std::vector<float> a0 = download(gpu, A0);
    EXPECT_EQ(std::memcmp(a0.data(), un.act.data(), a0.size() * 4), 0) << "fusion off is not the separate pair";
  }

  // act straight from the fused h13 by the separate SwiGLU kernel.
  auto H = upload(gpu, fz.h13, DType::BF16, {R, 2 * f});
  auto A = upload(gpu, std::vector<float>(R * f, nan), DType::BF16, {R, f});
  gpu.swiglu_forward(H, WP, A);
  const std::vector<float> act_of_h13 = download(gpu, A);

  std::vector<float> h_ref(R * 2 * f), a_ref(R * f);
  cpu.grouped_gemm_swiglu(host(x, {R, c.in}), host(w13, {E, 2 * f, c.in}), host_i32(off, {E + 1}), host(wp, {R}),
                          host(h_ref, {R, 2 * f}), host(a_ref, {R, f}));

  EXPECT_EQ(bit_mismatches(fz.h13, un.h13), 0) << "h13 differs from the unfused sm90 forward";
  EXPECT_EQ(bit_mismatches(fz.act, act_of_h13), 0) << "act differs from swiglu_forward of the fused h13";
  EXPECT_EQ(bit_mismatches(fz.act, un.act), 0) << "act differs from the unfused pair";
  EXPECT_CLOSE_REL(fz.h13, h_ref, kTolBf16);
  EXPECT_CLOSE_REL(fz.act, a_ref, kTolBf16);
  EXPECT_CLOSE_REL(fb.act, a_ref, kTolBf16);
  int64_t pad_nonzero = 0;
  for (int64_t i = used * 2 * f; i < R * 2 * f; ++i) pad_nonzero += !(fz.h13[i] == 0.f);
  for (int64_t i = used * f; i < R * f; ++i) pad_nonzero += !(fz.act[i] == 0.f);
  EXPECT_EQ(pad_nonzero, 0) << "padding rows not zeroed";
}

void check_all(Ops& gpu, Ops& cpu, const Case& c, uint32_t seed) {
  for (int bn : {256, 128})
    for (int tma : {1, 0}) check(gpu, cpu, c, bn, tma, seed + static_cast<uint32_t>(bn + tma));
}

// The backward's middle: dgrad through W2 with the SwiGLU backward in its epilogue.
void check_backward(Ops& gpu, Ops& cpu, const Case& c, int bn, uint32_t seed) {
  SCOPED_TRACE("backward: out=" + std::to_string(c.in) + " f=" + std::to_string(c.f) + " BN=" + std::to_string(bn));
  Guard guard;
  sm90::set_grouped_tail_split(0);  // the fused kernels never split their last round: the same sums bit for bit
  const int64_t E = static_cast<int64_t>(c.loads.size()), d = c.in, f = c.f;
  std::vector<int32_t> off(E + 1, 0);
  for (int64_t e = 0; e < E; ++e) off[e + 1] = off[e] + c.loads[e];
  const int64_t used = off[E], R = used + c.padding;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto dy = randn(R * d, seed);
  auto w2 = randn(E * d * f, seed + 1, 0.1f);
  auto h13 = randn(R * 2 * f, seed + 2, 2.f);
  auto wp = randn(R, seed + 3, 0.5f);
  round_bf16(dy);
  round_bf16(w2);
  round_bf16(h13);
  for (int64_t i = used * d; i < R * d; ++i) dy[i] = nan;  // padding rows must not reach any output

  auto DY = upload(gpu, dy, DType::BF16, {R, d});
  auto W = upload(gpu, w2, DType::BF16, {E, d, f});
  auto H = upload(gpu, h13, DType::BF16, {R, 2 * f});
  auto WP = upload(gpu, wp, DType::F32, {R});
  auto OFF = upload_i32(gpu, off, {E + 1});
  struct Out {
    std::vector<float> dh13, dwp;
    std::string impl;
  };
  auto run = [&](bool fused, sm90::GroupedImpl impl) {
    sm90::set_grouped_impl(impl);
    sm90::set_grouped_tile_n(bn);
    sm90::set_grouped_swiglu_fusion(1);
    auto DACT = upload(gpu, std::vector<float>(R * f, nan), DType::BF16, {R, f});
    auto DH = upload(gpu, std::vector<float>(R * 2 * f, nan), DType::BF16, {R, 2 * f});
    auto DWP = upload(gpu, std::vector<float>(R, nan), DType::F32, {R});
    if (fused) {
      gpu.grouped_gemm_dgrad_swiglu(DY, W, OFF, H, WP, DACT, DH, DWP);
    } else {
      gpu.grouped_gemm_dgrad(DY, W, OFF, DACT);
      gpu.swiglu_backward(DACT, H, WP, DH, DWP);
    }
    Out o{download(gpu, DH), download(gpu, DWP), sm90::last_grouped_impl()};
    return o;
  };
  const Out fz = run(true, sm90::GroupedImpl::Sm90);
  const Out fz2 = run(true, sm90::GroupedImpl::Sm90);
  const Out un = run(false, sm90::GroupedImpl::Sm90);
  const Out fb = run(true, sm90::GroupedImpl::Wmma);
  EXPECT_EQ(fz.impl, "sm90");
  EXPECT_EQ(fb.impl, "wmma");

  std::vector<float> dact(R * f), dh_ref(R * 2 * f), dwp_ref(R);
  cpu.grouped_gemm_dgrad_swiglu(host(dy, {R, d}), host(w2, {E, d, f}), host_i32(off, {E + 1}), host(h13, {R, 2 * f}),
                                host(wp, {R}), host(dact, {R, f}), host(dh_ref, {R, 2 * f}), host(dwp_ref, {R}));

  EXPECT_EQ(bit_mismatches(fz.dh13, un.dh13), 0) << "dh13 differs from the unfused dgrad + swiglu_backward";
  EXPECT_EQ(bit_mismatches(fz.dh13, fz2.dh13) + bit_mismatches(fz.dwp, fz2.dwp), 0) << "not deterministic";
  EXPECT_CLOSE_REL(fz.dwp, un.dwp, 1e-5);  // fp32 sums of the same products in another order
  EXPECT_CLOSE_REL(fz.dh13, dh_ref, kTolBf16);
  EXPECT_CLOSE_REL(fz.dwp, dwp_ref, kTolBf16);
  EXPECT_CLOSE_REL(fb.dh13, dh_ref, kTolBf16);
  EXPECT_CLOSE_REL(fb.dwp, dwp_ref, kTolBf16);
  int64_t pad_nonzero = 0;
  for (int64_t i = used * 2 * f; i < R * 2 * f; ++i) pad_nonzero += !(fz.dh13[i] == 0.f);
  for (int64_t i = used; i < R; ++i) pad_nonzero += !(fz.dwp[i] == 0.f);
  EXPECT_EQ(pad_nonzero, 0) << "padding rows not zeroed";
}

TEST(CudaGroupedGemmSwiglu, SmallShapesAndPartialTiles) {
  MXT_REQUIRE_SM90();
  auto gpu = make_cuda_ops();
  auto cpu = make_cpu_ops();
  check_all(*gpu, *cpu, {40, 72, {37, 0, 101, 5}, 3}, 1);    // f = 72: one partial gate / up half
  check_all(*gpu, *cpu, {64, 8, {3, 9}, 1}, 2);              // the smallest f
  check_all(*gpu, *cpu, {200, 136, {63, 1, 191}, 0}, 3);     // no padding, K % 64 != 0
}

TEST(CudaGroupedGemmSwiglu, TileEdgesEmptyExpertsAndManyItems) {
  MXT_REQUIRE_SM90();
  auto gpu = make_cuda_ops();
  auto cpu = make_cpu_ops();
  check_all(*gpu, *cpu, {128, 160, {128, 256, 127, 129, 1, 0, 64, 65}, 17}, 11);
  check_all(*gpu, *cpu, {64, 64, {0, 0, 0}, 130}, 12);      // every row is padding
  check_all(*gpu, *cpu, {512, 1024, {410, 0, 77, 1023, 256, 3, 600, 290}, 40}, 13);
}

TEST(CudaGroupedGemmSwiglu, BackwardInTheDgradEpilogue) {
  MXT_REQUIRE_SM90();
  auto gpu = make_cuda_ops();
  auto cpu = make_cpu_ops();
  for (int bn : {256, 128}) {
    check_backward(*gpu, *cpu, {40, 72, {37, 0, 101, 5}, 3}, bn, 21);    // f = 72: a partial n-tile
    check_backward(*gpu, *cpu, {64, 8, {3, 9}, 1}, bn, 22);
    check_backward(*gpu, *cpu, {128, 160, {128, 256, 127, 129, 1, 0, 64, 65}, 17}, bn, 23);
    check_backward(*gpu, *cpu, {64, 64, {0, 0, 0}, 130}, bn, 24);       // every row is padding
    check_backward(*gpu, *cpu, {512, 1024, {410, 0, 77, 1023, 256, 3, 600, 290}, 40}, bn, 25);
  }
}

}  // namespace
}  // namespace mxt::testing
