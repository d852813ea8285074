// The Hopper grouped expert GEMMs (grouped_gemm_sm90.cu: TMA + wgmma) against the CPU twin and against the
// wmma kernels, in all four configurations (block-tile width BN 256 / 128, clusters of 1 / 2 CTAs sharing a tile
// by TMA multicast: pairs of m-tiles, the second often without rows, in the forward and dgrad), at shapes that hit
// every edge: loads that are not multiples of the 128-row tile, empty experts, padding rows (filled with NaN in the inputs: the kernels must
// neither store them nor let them into dW), output widths that are not multiples of BN, contraction lengths
// that are not multiples of 64, more work items than SMs (the persistent loop and the barrier phases wrap),
// more than 32 experts (the on-device schedule scan), and operands the sm90 path must refuse (misaligned views).
//
// Tolerances (inputs are bf16-exact, so every product is exact in fp32 and only summation order differs):
//   y, dx (bf16 outputs): rel L2 < 1e-2 against the CPU (one bf16 rounding per element, ~2e-3 rel L2),
//     and < 1e-2 against the wmma path (two independent roundings of nearly equal fp32 sums);
//   dW (f32, accumulated onto random values): rel L2 < 1e-5 against the CPU (fp32 sums in another order:
//     ~sqrt(rows) x 2^-24 relative), the project's fp32 tolerance.
// Skips without a GPU, and (with a note) on a GPU that is not sm_90.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.hpp"
#include "sm90_cluster_code.hpp"
#include "sm90_grouped_gemm.cuh"

namespace mxt::testing {
namespace {

constexpr double kTolBf16 = 1e-2;
constexpr double kTolF32 = 1e-5;

// Restores the default implementation choice when a test ends (other tests share the process).
struct ImplGuard {
  ~ImplGuard() {
    sm90::set_grouped_impl(sm90::GroupedImpl::Auto);
    sm90::set_grouped_tile_n(0);
    sm90::set_grouped_cluster(0);
    sm90::set_grouped_tma_store(-1);
    sm90::set_grouped_wgrad_tma(-1);
    sm90::set_grouped_wgrad_pair(-1);
    sm90::set_grouped_wgrad_group(-1);
    sm90::set_grouped_l2_hints(-1);
    sm90::set_grouped_tail_split(-1);
  }
};

struct Case {
  int64_t in, out;
  std::vector<int32_t> loads;  // rows per expert
  int64_t padding;             // rows past offsets[E]
};

std::string describe(const Case& c, int bn, int cl) {
  std::string s = "in=" + std::to_string(c.in) + " out=" + std::to_string(c.out) + " E=" +
                  std::to_string(c.loads.size()) + " loads={";
  for (size_t e = 0; e < c.loads.size() && e < 12; ++e) s += (e ? "," : "") + std::to_string(c.loads[e]);
  if (c.loads.size() > 12) s += ",...";
  return s + "} padding=" + std::to_string(c.padding) + " BN=" + std::to_string(bn) +
         " cluster=" + sm90::cluster_code_name(cl);
}

std::vector<float> rounded(size_t n, uint32_t seed, float scale = 1.f) {
  auto v = randn(n, seed, scale);
  round_bf16(v);
  return v;
}

// Rows [used, R) of a [R, w] host matrix set to NaN (what an unwritten capacity buffer may hold).
void nan_rows(std::vector<float>& v, int64_t used, int64_t R, int64_t w) {
  for (int64_t i = used * w; i < R * w; ++i) v[i] = std::numeric_limits<float>::quiet_NaN();
}

int64_t nonzero_count(const std::vector<float>& v, int64_t begin, int64_t end) {
  int64_t n = 0;
  for (int64_t i = begin; i < end; ++i) n += !(v[i] == 0.f);
  return n;
}

struct Outputs {
  std::vector<float> y, dx, dw;
};

// Runs forward, dgrad and wgrad on the device with the given implementation; asserts the path taken.
Outputs run_device(Ops& gpu, const Case& c, const std::vector<int32_t>& off, const std::vector<float>& x,
                   const std::vector<float>& w, const std::vector<float>& dy, const std::vector<float>& dw0,
                   sm90::GroupedImpl impl) {
  const int64_t E = static_cast<int64_t>(c.loads.size()), R = off[E] + c.padding;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  sm90::set_grouped_impl(impl);
  const char* want = impl == sm90::GroupedImpl::Wmma ? "wmma" : "sm90";
  auto X = upload(gpu, x, DType::BF16, {R, c.in});
  auto W = upload(gpu, w, DType::BF16, {E, c.out, c.in});
  auto DY = upload(gpu, dy, DType::BF16, {R, c.out});
  auto OFF = upload_i32(gpu, off, {E + 1});
  auto Y = upload(gpu, std::vector<float>(R * c.out, nan), DType::BF16, {R, c.out});
  auto DX = upload(gpu, std::vector<float>(R * c.in, nan), DType::BF16, {R, c.in});
  auto DW = upload(gpu, dw0, DType::F32, {E, c.out, c.in});
  gpu.grouped_gemm(X, W, OFF, Y);
  EXPECT_STREQ(sm90::last_grouped_impl(), want) << "forward";
  gpu.grouped_gemm_dgrad(DY, W, OFF, DX);
  EXPECT_STREQ(sm90::last_grouped_impl(), want) << "dgrad";
  gpu.grouped_gemm_wgrad(DY, X, OFF, DW);
  EXPECT_STREQ(sm90::last_grouped_impl(), want) << "wgrad";
  Outputs o;
  o.y = download(gpu, Y);
  o.dx = download(gpu, DX);
  o.dw = download(gpu, DW);
  return o;
}

// sm90 vs CPU twin and vs wmma for one case and configuration. NaN fills the padding rows of x and dy.
void check_case(Ops& gpu, Ops& cpu, const Case& c, int bn, int cl, uint32_t seed) {
  SCOPED_TRACE(describe(c, bn, cl));
  ImplGuard guard;
  sm90::set_grouped_tile_n(bn);
  sm90::use_cluster_code(cl);
  const int64_t E = static_cast<int64_t>(c.loads.size());
  std::vector<int32_t> off(E + 1, 0);
  for (int64_t e = 0; e < E; ++e) off[e + 1] = off[e] + c.loads[e];
  const int64_t used = off[E], R = used + c.padding;
  auto x = rounded(R * c.in, seed);
  auto w = rounded(E * c.out * c.in, seed + 1, 0.05f);
  auto dy = rounded(R * c.out, seed + 2);
  auto dw0 = randn(E * c.out * c.in, seed + 3);
  nan_rows(x, used, R, c.in);
  nan_rows(dy, used, R, c.out);

  const Outputs s = run_device(gpu, c, off, x, w, dy, dw0, sm90::GroupedImpl::Sm90);
  const Outputs m = run_device(gpu, c, off, x, w, dy, dw0, sm90::GroupedImpl::Wmma);

  std::vector<float> y_ref(R * c.out), dx_ref(R * c.in), dw_ref = dw0;
  cpu.grouped_gemm(host(x, {R, c.in}), host(w, {E, c.out, c.in}), host_i32(off, {E + 1}), host(y_ref, {R, c.out}));
  cpu.grouped_gemm_dgrad(host(dy, {R, c.out}), host(w, {E, c.out, c.in}), host_i32(off, {E + 1}),
                         host(dx_ref, {R, c.in}));
  cpu.grouped_gemm_wgrad(host(dy, {R, c.out}), host(x, {R, c.in}), host_i32(off, {E + 1}),
                         host(dw_ref, {E, c.out, c.in}));
  {
    SCOPED_TRACE("forward");
    EXPECT_CLOSE_REL(s.y, y_ref, kTolBf16);
    EXPECT_CLOSE_REL(s.y, m.y, kTolBf16);
    EXPECT_EQ(nonzero_count(s.y, used * c.out, R * c.out), 0) << "padding rows of y not zeroed";
  }
  {
    SCOPED_TRACE("dgrad");
    EXPECT_CLOSE_REL(s.dx, dx_ref, kTolBf16);
    EXPECT_CLOSE_REL(s.dx, m.dx, kTolBf16);
    EXPECT_EQ(nonzero_count(s.dx, used * c.in, R * c.in), 0) << "padding rows of dx not zeroed";
  }
  {
    SCOPED_TRACE("wgrad");
    EXPECT_CLOSE_REL(s.dw, dw_ref, kTolF32);
    for (int64_t e = 0; e < E; ++e) {
      if (c.loads[e] != 0) continue;  // an expert without rows leaves dW[e] bit-for-bit unchanged
      int64_t changed = 0;
      for (int64_t i = e * c.out * c.in; i < (e + 1) * c.out * c.in; ++i)
        changed += std::memcmp(&s.dw[i], &dw0[i], 4) != 0;
      EXPECT_EQ(changed, 0) << "dW of expert " << e << " (no rows) changed";
    }
  }
}

void check_both_tiles(Ops& gpu, Ops& cpu, const Case& c, int cl, uint32_t seed) {
  for (int bn : {256, 128}) check_case(gpu, cpu, c, bn, cl, seed + static_cast<uint32_t>(bn + 1000 * cl));
}

// The correctness tests run once per cluster code (sm90_cluster_code.hpp): .../0 = 1 CTA, .../1 = clusters of 2 (TMA
// multicast), .../2 = clusters of 2 with the wgrad's pairs over m-tiles, so a run can take the plain kernels alone
// (--gtest_filter='*Sm90*/0').
class CudaGroupedGemmSm90 : public ::testing::TestWithParam<int> {};
INSTANTIATE_TEST_SUITE_P(Cluster, CudaGroupedGemmSm90, ::testing::Values(1, 2, 3));

TEST_P(CudaGroupedGemmSm90, SmallShapesNotMultiplesOfTheTile) {
  MXT_REQUIRE_SM90();
  auto gpu = make_cuda_ops();
  auto cpu = make_cpu_ops();
  check_both_tiles(*gpu, *cpu, {40, 72, {37, 0, 101, 5}, 3}, GetParam(), 1);   // K = 40: one partial k-block
  check_both_tiles(*gpu, *cpu, {72, 40, {37, 0, 101, 5}, 3}, GetParam(), 2);
  check_both_tiles(*gpu, *cpu, {8, 8, {3, 9}, 1}, GetParam(), 3);               // the smallest sizes the path takes
}

TEST_P(CudaGroupedGemmSm90, TileEdgeLoadsEmptyExpertsAndPadding) {
  MXT_REQUIRE_SM90();
  auto gpu = make_cuda_ops();
  auto cpu = make_cpu_ops();
  check_both_tiles(*gpu, *cpu, {128, 128, {128, 256, 127, 129, 1, 0, 64, 65}, 128}, GetParam(), 11);
  check_both_tiles(*gpu, *cpu, {256, 320, {130, 3, 0, 64, 200, 1, 0, 90}, 17}, GetParam(), 12);  // out%256 != 0
  check_both_tiles(*gpu, *cpu, {200, 136, {63, 1, 191}, 0}, GetParam(), 13);                     // no padding, K % 64 != 0
  check_both_tiles(*gpu, *cpu, {64, 64, {0, 0, 0}, 130}, GetParam(), 14);                        // every row is padding
  check_both_tiles(*gpu, *cpu, {96, 64, {300}, 5}, GetParam(), 15);                              // a single expert
  check_both_tiles(*gpu, *cpu, {128, 192, {48, 80, 32, 112, 16}, 9}, GetParam(), 16);  // wgrad tails of 16k rows
}

// Experts with an odd number of m-tiles around the bench shapes' ~1,024 rows: with CTA pairs and an even number of
// n-tiles their last m-tile runs over two n-tiles (forward 512 wide: 2 or 4 n-tiles; dgrad 256 wide: 1 n-tile at
// BN = 256, the unpaired path, 2 at BN = 128), including experts of one m-tile only.
TEST_P(CudaGroupedGemmSm90, OddMTilesOverPairsOfNTiles) {
  MXT_REQUIRE_SM90();
  auto gpu = make_cuda_ops();
  auto cpu = make_cpu_ops();
  check_both_tiles(*gpu, *cpu, {256, 512, {1030, 1000, 129, 127, 1, 0, 385}, 7}, GetParam(), 61);
  check_both_tiles(*gpu, *cpu, {192, 768, {90, 1}, 0}, GetParam(), 62);  // 3 / 6 n-tiles, every expert one m-tile
}

// More work items than SMs, 8+ k-blocks per item: the persistent loop and every barrier phase wrap many times.
TEST_P(CudaGroupedGemmSm90, ManyItemsPersistentLoop) {
  MXT_REQUIRE_SM90();
  auto gpu = make_cuda_ops();
  auto cpu = make_cpu_ops();
  check_both_tiles(*gpu, *cpu, {512, 2048, {410, 0, 77, 1023, 256, 3, 600, 290}, 40}, GetParam(), 21);
  check_both_tiles(*gpu, *cpu, {1024, 512, {700, 129, 1, 1200}, 9}, GetParam(), 22);
}

// The epilogues without the TMA: forward / dgrad rows stored from the registers (the path the tail of each
// expert takes anyway, here for whole tiles too), the weight gradient added by red.global from the registers.
TEST_P(CudaGroupedGemmSm90, DirectStoreEpilogue) {
  MXT_REQUIRE_SM90();
  ImplGuard guard;
  auto gpu = make_cuda_ops();
  auto cpu = make_cpu_ops();
  for (int bn : {256, 128}) {
    sm90::set_grouped_tma_store(0);  // check_case's own guard restores the defaults when it returns
    sm90::set_grouped_wgrad_tma(0);
    check_case(*gpu, *cpu, {128, 320, {128, 256, 127, 129, 1, 0, 64, 65}, 9}, bn, GetParam(), 16 + bn);
  }
}

// More than 32 experts: the schedule's prefix scan runs over several warps' worth of experts.
TEST_P(CudaGroupedGemmSm90, ManyExperts) {
  MXT_REQUIRE_SM90();
  auto gpu = make_cuda_ops();
  auto cpu = make_cpu_ops();
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> d(0, 40);
  Case c{64, 128, {}, 11};
  for (int e = 0; e < 70; ++e) c.loads.push_back(e % 9 == 0 ? 0 : d(rng));
  check_both_tiles(*gpu, *cpu, c, GetParam(), 31);
}

// The Mixtral-8x1B expert shapes at a reduced row count (uneven over 8 experts): the benchmark's kernels.
TEST_P(CudaGroupedGemmSm90, ModelShapes8x1B) {
  MXT_REQUIRE_SM90();
  auto gpu = make_cuda_ops();
  auto cpu = make_cpu_ops();
  const std::vector<int32_t> loads = {300, 0, 677, 290};  // 4 experts keep the host reference quick
  check_case(*gpu, *cpu, {2048, 8192, loads, 24}, 256, GetParam(), 41);  // w13: hidden 2048 -> 2 x 4096
  check_case(*gpu, *cpu, {4096, 2048, loads, 24}, 256, GetParam(), 42);  // w2: 4096 -> 2048
}

// The last round of units split along K (tail_split): around the 8x7B trainer's ~1,024 rows per expert at reduced
// widths, 8 experts of 5 m-tiles x 4 n-tiles, so more units than CTAs or pairs and a short last round (the
// default split, up to 8 parts), against no split (0) and at most 2 parts; every split part is at least 2 k-blocks.
// MXTRAIN_GG_FAULT=split (the last part adds only its own partial) fails here and in most cases above, whose
// single round of units splits too.
TEST_P(CudaGroupedGemmSm90, TailSplitPartsAddUp) {
  MXT_REQUIRE_SM90();
  ImplGuard guard;
  auto gpu = make_cuda_ops();
  auto cpu = make_cpu_ops();
  const Case c{1024, 1024, {520, 515, 530, 498, 525, 512, 540, 505}, 5};
  for (int parts : {-1, 0, 2}) {
    SCOPED_TRACE("tail split " + std::to_string(parts));
    sm90::set_grouped_tail_split(parts);
    check_case(*gpu, *cpu, c, 256, GetParam(), 71 + static_cast<uint32_t>(parts));
  }
}

// The sm90 kernels twice on the same inputs (4 experts, one empty, padding rows), `first` and `second` making the
// settings of each run: every output bit the same.
void expect_same_bits(const Case& c, uint32_t seed, int cluster_code, const std::function<void()>& first,
                      const std::function<void()>& second) {
  MXT_REQUIRE_SM90();
  ImplGuard guard;
  auto gpu = make_cuda_ops();
  const int64_t E = static_cast<int64_t>(c.loads.size());
  std::vector<int32_t> off(E + 1, 0);
  for (int64_t e = 0; e < E; ++e) off[e + 1] = off[e] + c.loads[e];
  const int64_t R = off[E] + c.padding;
  auto x = rounded(R * c.in, seed), w = rounded(E * c.out * c.in, seed + 1, 0.05f), dy = rounded(R * c.out, seed + 2);
  auto dw0 = randn(E * c.out * c.in, seed + 3);
  sm90::use_cluster_code(cluster_code);
  first();
  const Outputs a = run_device(*gpu, c, off, x, w, dy, dw0, sm90::GroupedImpl::Sm90);
  second();
  const Outputs b = run_device(*gpu, c, off, x, w, dy, dw0, sm90::GroupedImpl::Sm90);
  EXPECT_EQ(std::memcmp(a.y.data(), b.y.data(), a.y.size() * 4), 0);
  EXPECT_EQ(std::memcmp(a.dx.data(), b.dx.data(), a.dx.size() * 4), 0);
  EXPECT_EQ(std::memcmp(a.dw.data(), b.dw.data(), a.dw.size() * 4), 0);
}

// Same inputs twice: bit-identical outputs (no atomics; every output tile is owned by one CTA).
TEST_P(CudaGroupedGemmSm90, Deterministic) {
  expect_same_bits({256, 384, {200, 0, 333, 17}, 6}, 51, GetParam(), [] {}, [] {});
}

// L2 eviction hints (and the wgrad's raster groups they go with) change where operands live, not one output bit.
TEST_P(CudaGroupedGemmSm90, L2HintsChangeNoBit) {
  expect_same_bits(
      {640, 384, {200, 0, 333, 17}, 6}, 55, GetParam(), [] { sm90::set_grouped_l2_hints(0); },
      [] {
        sm90::set_grouped_l2_hints(sm90::kL2HintsAll);
        sm90::set_grouped_wgrad_group(1);
      });
}

// What the sm90 path must refuse goes to wmma, with right answers: widths not multiples of 8, misaligned views.
TEST(CudaGroupedGemmSm90Host, FallsBackWhereItDoesNotApply) {
  MXT_REQUIRE_SM90();
  ImplGuard guard;
  auto gpu = make_cuda_ops();
  auto cpu = make_cpu_ops();
  sm90::set_grouped_impl(sm90::GroupedImpl::Sm90);
  {  // in = 36: row stride not a multiple of 16 bytes
    const int64_t E = 2, in = 36, out = 64, R = 50;
    std::vector<int32_t> off = {0, 20, 45};
    auto x = rounded(R * in, 61), w = rounded(E * out * in, 62, 0.05f);
    auto X = upload(*gpu, x, DType::BF16, {R, in});
    auto W = upload(*gpu, w, DType::BF16, {E, out, in});
    auto OFF = upload_i32(*gpu, off, {E + 1});
    DeviceTensor Y(*gpu, DType::BF16, {R, out});
    gpu->grouped_gemm(X, W, OFF, Y);
    EXPECT_STREQ(sm90::last_grouped_impl(), "wmma");
    std::vector<float> y_ref(R * out);
    cpu->grouped_gemm(host(x, {R, in}), host(w, {E, out, in}), host_i32(off, {E + 1}), host(y_ref, {R, out}));
    EXPECT_CLOSE_REL(download(*gpu, Y), y_ref, kTolBf16);
  }
  {  // x is a view one element into its buffer: not 16-byte aligned
    const int64_t E = 2, in = 64, out = 64, R = 50;
    std::vector<int32_t> off = {0, 20, 45};
    auto x = rounded(R * in, 63), w = rounded(E * out * in, 64, 0.05f);
    DeviceTensor xbuf(*gpu, DType::BF16, {R * in + 1});
    Tensor X(static_cast<uint16_t*>(xbuf.t.data) + 1, DType::BF16, {R, in}, Device::CUDA);
    std::vector<uint16_t> xb(x.size());
    for (size_t i = 0; i < x.size(); ++i) xb[i] = f32_to_bf16_bits(x[i]);
    gpu->upload(X.data, xb.data(), xb.size() * 2);
    auto W = upload(*gpu, w, DType::BF16, {E, out, in});
    auto OFF = upload_i32(*gpu, off, {E + 1});
    DeviceTensor Y(*gpu, DType::BF16, {R, out});
    gpu->grouped_gemm(X, W, OFF, Y);
    EXPECT_STREQ(sm90::last_grouped_impl(), "wmma");
    std::vector<float> y_ref(R * out);
    cpu->grouped_gemm(host(x, {R, in}), host(w, {E, out, in}), host_i32(off, {E + 1}), host(y_ref, {R, out}));
    EXPECT_CLOSE_REL(download(*gpu, Y), y_ref, kTolBf16);
  }
  gpu->synchronize();
}

TEST(CudaGroupedGemmSm90Host, RejectsBadConfigurations) {
  ImplGuard guard;
  EXPECT_THROW(sm90::set_grouped_tile_n(192), std::runtime_error);
  EXPECT_NO_THROW(sm90::set_grouped_tile_n(128));
  EXPECT_THROW(sm90::set_grouped_cluster(4), std::runtime_error);
  EXPECT_NO_THROW(sm90::set_grouped_cluster(2));
}

}  // namespace
}  // namespace mxt::testing
