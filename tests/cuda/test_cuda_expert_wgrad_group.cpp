// The expert weight gradient over several row sets (grouped_gemm_wgrad_sets, expert_wgrad_micro_batches): one
// Hopper launch contracts each expert's rows of every set into dW[e] before its one read-add-write, or its one
// store when the call overwrites. Against the CPU twin (a zeroing when overwriting, then the single calls) on
// fresh random inputs: uneven loads, an expert empty in some sets or in all (accumulating: its dW bit for bit
// unchanged; overwriting: exact zeros), loads that are not multiples of the 64-row k-block, NaN padding rows, up
// to 9 sets (two launches), more experts than one launch's schedule holds for all sets, both tile widths and
// cluster sizes; then trainer runs grouped and ungrouped. Tolerance: inputs are bf16-exact, so only the fp32
// summation order differs (rel L2 < 1e-5, the project's fp32 tolerance). Skips without an sm_90 GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "cuda_context.cuh"
#include "cuda_ops.hpp"
#include "cuda_test_util.hpp"
#include "sm90_cluster_code.hpp"
#include "sm90_grouped_gemm.cuh"
#include "tiny_config.hpp"
#include "trained_run.hpp"
#include "mxtrain/data.hpp"
#include "mxtrain/trainer.hpp"
#include "mxtrain/wgrad_tails.hpp"
#include "wgrad_tails.hpp"

namespace mxt::testing {
namespace {

struct Guard {
  ~Guard() {
    sm90::set_grouped_tile_n(0);
    sm90::set_grouped_cluster(0);
    sm90::set_grouped_wgrad_tma(-1);
    sm90::set_grouped_wgrad_tail(-1);
    sm90::set_grouped_wgrad_gather(-1);
    sm90::set_grouped_wgrad_lockstep(-1);
    sm90::set_grouped_wgrad_pair(-1);
    sm90::set_grouped_wgrad_group(-1);
    sm90::set_grouped_wgrad_order(-1);
    sm90::set_grouped_wgrad_epi_bars(-1);
    sm90::set_grouped_wgrad_epi_stmatrix(-1);
    sm90::record_wgrad_order(false);
    sm90::set_grouped_l2_hints(-1);
  }
};

// One row set: per-expert loads, padding rows past the last expert (NaN in dy and x).
struct RowSet {
  std::vector<int32_t> loads;
  int64_t padding;
  std::vector<int32_t> off;
  std::vector<float> dy, x;
  int64_t R = 0;
};

RowSet make_set(std::vector<int32_t> loads, int64_t padding, int64_t out, int64_t in, uint32_t seed) {
  RowSet s{std::move(loads), padding, {0}, {}, {}};
  for (int32_t n : s.loads) s.off.push_back(s.off.back() + n);
  const int64_t used = s.off.back();
  s.R = used + padding;
  s.dy = randn(s.R * out, seed);
  s.x = randn(s.R * in, seed + 1);
  round_bf16(s.dy);
  round_bf16(s.x);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t i = used * out; i < s.R * out; ++i) s.dy[i] = nan;
  for (int64_t i = used * in; i < s.R * in; ++i) s.x[i] = nan;
  return s;
}

// dW0 (+)= the sets' contractions by the CPU twin.
std::vector<float> cpu_sets(Ops& cpu, std::vector<RowSet>& sets, int64_t out, int64_t in,
                            const std::vector<float>& dw0, bool accumulate) {
  const int64_t E = static_cast<int64_t>(sets[0].loads.size());
  std::vector<float> ref = dw0;
  std::vector<Ops::WgradRowSet> host_sets;
  for (RowSet& r : sets) host_sets.push_back({host(r.dy, {r.R, out}), host(r.x, {r.R, in}), host_i32(r.off, {E + 1})});
  cpu.grouped_gemm_wgrad_sets(host_sets, host(ref, {E, out, in}), accumulate);
  return ref;
}

// The row sets on the device (dy and x in bf16).
struct DeviceSets {
  std::vector<DeviceTensor> keep;
  std::vector<Ops::WgradRowSet> sets;
  DeviceSets(Ops& gpu, const std::vector<RowSet>& host_sets, int64_t out, int64_t in) {
    const int64_t E = static_cast<int64_t>(host_sets[0].loads.size());
    for (const RowSet& r : host_sets) {
      keep.push_back(upload(gpu, r.dy, DType::BF16, {r.R, out}));
      keep.push_back(upload(gpu, r.x, DType::BF16, {r.R, in}));
      keep.push_back(upload_i32(gpu, r.off, {E + 1}));
      sets.push_back({keep[keep.size() - 3].t, keep[keep.size() - 2].t, keep.back().t});
    }
  }
};

// How many values of a differ from b's in their bits (a and b the same length).
int64_t bits_differ(const std::vector<float>& a, const std::vector<float>& b) {
  int64_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], 4) != 0;
  return n;
}

// The same on the device, with the kernel settings in force; asserts that the Hopper kernel ran.
std::vector<float> gpu_sets(Ops& gpu, const std::vector<RowSet>& sets, int64_t out, int64_t in,
                            const std::vector<float>& dw0, bool accumulate) {
  const int64_t E = static_cast<int64_t>(sets[0].loads.size());
  const DeviceSets dev(gpu, sets, out, in);
  auto DW = upload(gpu, dw0, DType::F32, {E, out, in});
  sm90::note_grouped_impl("none");
  gpu.grouped_gemm_wgrad_sets(dev.sets, DW, accumulate);
  EXPECT_STREQ(sm90::last_grouped_impl(), "sm90");
  return download(gpu, DW);
}

void check_sets(Ops& gpu, Ops& cpu, int64_t out, int64_t in, std::vector<RowSet> sets, uint32_t seed,
                bool with_variants = true) {
  const int64_t E = static_cast<int64_t>(sets[0].loads.size());
  auto dw0 = randn(E * out * in, seed);
  for (const bool accumulate : {true, false}) {
    const std::vector<float> ref = cpu_sets(cpu, sets, out, in, dw0, accumulate);
    for (int bn : {256, 128}) {
      for (int cl : {1, 2, 3}) {
       for (int tma : {1, 0}) {  // the epilogue: TMA reduce-adds / stores, or red.global / st.global
        if (!with_variants && (bn != 256 || cl != 1)) continue;
        SCOPED_TRACE("out " + std::to_string(out) + " in " + std::to_string(in) + " sets " +
                     std::to_string(sets.size()) + " BN " + std::to_string(bn) + " cluster " + sm90::cluster_code_name(cl) +
                     (tma ? " TMA" : " direct") + (accumulate ? " accumulating" : " overwriting"));
        Guard guard;
        sm90::set_grouped_tile_n(bn);
        sm90::use_cluster_code(cl);
        sm90::set_grouped_wgrad_tma(tma);
        const std::vector<float> got = gpu_sets(gpu, sets, out, in, dw0, accumulate);
        EXPECT_CLOSE_REL(got, ref, 1e-5);
        for (int64_t e = 0; e < E; ++e) {
          bool empty = true;
          for (const RowSet& r : sets) empty = empty && r.loads[e] == 0;
          if (!empty) continue;
          int64_t wrong = 0;
          for (int64_t i = e * out * in; i < (e + 1) * out * in; ++i)
            wrong += accumulate ? std::memcmp(&got[i], &dw0[i], 4) != 0 : got[i] != 0.f;
          EXPECT_EQ(wrong, 0) << "dW of expert " << e << " (no rows in any set) "
                              << (accumulate ? "changed" : "is not zero");
        }
       }
      }
    }
  }
}

TEST(CudaExpertWgradGroup, RowSetsAgainstTheSingleCalls) {
  MXT_REQUIRE_SM90();
  auto gpu = make_cuda_ops();
  auto cpu = make_cpu_ops();
  // expert 1 empty in the first set only, expert 3 in the second only, expert 4 in both
  check_sets(*gpu, *cpu, 136, 72,
             {make_set({37, 0, 101, 64, 0, 130}, 3, 136, 72, 1), make_set({5, 66, 0, 0, 0, 191}, 0, 136, 72, 3)}, 5);
  // a set with no rows at all beside one with rows; single rows
  check_sets(*gpu, *cpu, 64, 64, {make_set({0, 0, 0}, 7, 64, 64, 7), make_set({1, 300, 2}, 1, 64, 64, 9)}, 11);
  // three and eight sets (one launch), nine (two launches); expert 2 empty in all of them
  for (const int n : {3, 8, 9}) {
    std::vector<RowSet> sets;
    for (int i = 0; i < n; ++i)
      sets.push_back(make_set({17 * i + 3, 64 * (i % 3), 0, 130 - 9 * i}, i % 2 ? 5 : 0, 128, 200, 21 + 2 * i));
    check_sets(*gpu, *cpu, 128, 200, sets, 40 + n);
  }
  // 100 experts: only 5 sets fit one launch's schedule, so 6 take two launches
  {
    std::vector<RowSet> sets;
    for (int i = 0; i < 6; ++i) {
      std::vector<int32_t> loads(100);
      for (int e = 0; e < 100; ++e) loads[e] = (e * 7 + i * 13) % 23 == 0 ? 0 : (e * 5 + i * 3) % 41;
      loads[9] = 0;
      sets.push_back(make_set(loads, 2, 64, 64, 60 + 2 * i));
    }
    check_sets(*gpu, *cpu, 64, 64, sets, 77, false);
  }
  // the 8x1B w2 shape, rows as one micro-batch splits them (fewer, to keep the host reference quick)
  check_sets(*gpu, *cpu, 2048, 4096,
             {make_set({300, 0, 677, 290}, 24, 2048, 4096, 13), make_set({250, 410, 380, 1}, 0, 2048, 4096, 15)}, 17,
             false);
}

// A row set's last k-block of an expert: the default runs only the k16 wgmmas over its rows (zeroing up to 15 rows
// of dy), the older mode zeroes the other rows of both operands and runs all 4. Same sums, so both against the CPU
// twin and bit for bit against each other (== per element), at tails of every kind: a multiple of 16 rows (no
// zeroing at all), 1 to 15 past one, a last expert ending in NaN padding (both operands zeroed there) or at the
// end of the set.
TEST(CudaExpertWgradGroup, TailStepsAgreeWithZeroedTails) {
  MXT_REQUIRE_SM90();
  auto gpu_ops = make_cuda_ops();
  auto cpu_ops = make_cpu_ops();
  Ops &gpu = *gpu_ops, &cpu = *cpu_ops;
  const int64_t out = 192, in = 320, E = 6;
  std::vector<RowSet> sets = {make_set({16, 80, 0, 47, 33, 113}, 5, out, in, 81),
                              make_set({48, 1, 64, 95, 0, 32}, 0, out, in, 83),
                              make_set({15, 17, 31, 49, 63, 128}, 9, out, in, 85)};
  const auto dw0 = randn(E * out * in, 87);
  const std::vector<float> ref = cpu_sets(cpu, sets, out, in, dw0, true);
  for (int bn : {256, 128}) {
    for (int cl : {1, 2, 3}) {
      std::vector<float> got[2];
      for (int tail : {0, 1}) {  // steps, zero
        SCOPED_TRACE("BN " + std::to_string(bn) + " cluster " + sm90::cluster_code_name(cl) + (tail ? " zero" : " steps"));
        Guard guard;
        sm90::set_grouped_tile_n(bn);
        sm90::use_cluster_code(cl);
        sm90::set_grouped_wgrad_tail(tail);
        got[tail] = gpu_sets(gpu, sets, out, in, dw0, true);
        EXPECT_CLOSE_REL(got[tail], ref, 1e-5);
      }
      int64_t differ = 0;
      for (size_t i = 0; i < got[0].size(); ++i) differ += !(got[0][i] == got[1][i]);
      EXPECT_EQ(differ, 0) << "BN " << bn << " cluster " << cl << ": the tail modes' sums differ";
    }
  }
}

// The tail gather alone against its CPU twin: every (set, expert)'s rows past its last whole 64-row k-block, bit for
// bit at the place wgrad_tail_layout gives them, and the tail set's offsets; rows past the last one untouched. Loads
// of 0, 1, 63, 64, 65, 127, 128 and 200 rows, and a set whose last offset runs past R: clamped as the GEMM clamps it,
// its last expert then takes the NaN padding rows too, and they move like any other rows.
TEST(CudaExpertWgradGroup, GatherCopiesEachTailRowToItsPlace) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  const int64_t out = 136, in = 72, E = 4;
  std::vector<RowSet> sets = {make_set({0, 1, 63, 64}, 3, out, in, 301), make_set({65, 127, 128, 200}, 0, out, in, 303),
                              make_set({70, 0, 0, 5}, 2, out, in, 305)};
  sets[2].off.back() = static_cast<int32_t>(sets[2].R + 40);  // the last expert's end past R: clamped to R
  const int nsets = static_cast<int>(sets.size());
  const int64_t cap = wgrad_tail_capacity(nsets, E);
  const DeviceSets dev(*gpu, sets, out, in);
  std::vector<sm90::WgradRows> rows;
  for (const auto& r : dev.sets)
    rows.push_back({static_cast<const __nv_bfloat16*>(r.dy.data), static_cast<const __nv_bfloat16*>(r.x.data),
                    static_cast<const int32_t*>(r.offsets.data), r.dy.shape[0]});
  const float sentinel = 7.5f;
  auto TDY = upload(*gpu, std::vector<float>(cap * out, sentinel), DType::BF16, {cap, out});
  auto TX = upload(*gpu, std::vector<float>(cap * in, sentinel), DType::BF16, {cap, in});
  auto TOFF = upload_i32(*gpu, std::vector<int32_t>(E + 1, -1), {E + 1});
  auto PLAN = upload_i32(*gpu, std::vector<int32_t>(3 * nsets * E, -1), {3 * nsets * E});
  sm90::gather_wgrad_tails(rows.data(), nsets, E, out, in, static_cast<__nv_bfloat16*>(TDY.t.data),
                           static_cast<__nv_bfloat16*>(TX.t.data), static_cast<int32_t*>(TOFF.t.data),
                           static_cast<int32_t*>(PLAN.t.data), dynamic_cast<CudaOps&>(*gpu).ctx().stream);
  const std::vector<float> tdy = download(*gpu, TDY), tx = download(*gpu, TX);
  const std::vector<int32_t> toff = download_i32(*gpu, TOFF);
  // The twin: counts from the clamped offsets, the layout, then the rows.
  std::vector<int32_t> r(nsets * E), first(nsets * E), off(E + 1), dst(nsets * E);
  for (int s = 0; s < nsets; ++s)
    for (int64_t e = 0; e < E; ++e) {
      const int32_t R = static_cast<int32_t>(sets[s].R);
      const int32_t lo = std::min(sets[s].off[e], R), hi = std::max(lo, std::min(sets[s].off[e + 1], R));
      r[s * E + e] = wgrad_tail_rows(lo, hi);
      first[s * E + e] = hi - r[s * E + e];
    }
  wgrad_tail_layout(r.data(), nsets, static_cast<int>(E), off.data(), dst.data());
  EXPECT_EQ(toff, off);
  EXPECT_EQ(off[E], 0 + 1 + 63 + 0 + 1 + 63 + 0 + 8 + 6 + 7) << "the loads above leave these rows (the last set's "
                                                               "last expert ends at R: 5 rows and 2 of padding)";
  std::vector<float> want_dy(cap * out, round_bf16(sentinel)), want_x(cap * in, round_bf16(sentinel));
  for (int s = 0; s < nsets; ++s)
    for (int64_t e = 0; e < E; ++e)
      for (int32_t j = 0; j < r[s * E + e]; ++j) {
        const int64_t from = first[s * E + e] + j, to = dst[s * E + e] + j;
        std::copy_n(&sets[s].dy[from * out], out, &want_dy[to * out]);
        std::copy_n(&sets[s].x[from * in], in, &want_x[to * in]);
      }
  EXPECT_EQ(0, std::memcmp(tdy.data(), want_dy.data(), tdy.size() * 4)) << "dy tail rows";
  EXPECT_EQ(0, std::memcmp(tx.data(), want_x.data(), tx.size() * 4)) << "x tail rows";
}

// Several sets in one launch gather their tails into one more set by default; with the gather off the tails stay
// in place. Both against the CPU twin (1e-5: only the fp32 summation order differs) at tails of every kind (none,
// 1, 15, 16, 63 rows; experts empty in some sets or all; NaN padding past the last expert), adding and storing,
// both tile widths, 1 CTA and both pairings; and against each other. MXTRAIN_GG_FAULT=tail (the tails never
// zeroed) fails it.
TEST(CudaExpertWgradGroup, GatheredTailsAgreeWithTailsInPlace) {
  MXT_REQUIRE_SM90();
  auto gpu_ops = make_cuda_ops();
  auto cpu_ops = make_cpu_ops();
  const int64_t out = 192, in = 320, E = 5;
  std::vector<RowSet> sets = {make_set({1, 80, 0, 64, 143}, 5, out, in, 401),
                              make_set({63, 15, 0, 129, 16}, 0, out, in, 403),
                              make_set({128, 200, 0, 0, 31}, 9, out, in, 405),
                              make_set({2, 64, 0, 47, 63}, 1, out, in, 407)};
  const auto dw0 = randn(E * out * in, 409);
  for (const bool accumulate : {true, false}) {
    const std::vector<float> ref = cpu_sets(*cpu_ops, sets, out, in, dw0, accumulate);
    for (int bn : {256, 128}) {
      for (int cl : {1, 2, 3}) {
        std::vector<float> got[2];
        for (int gather : {1, 0}) {
          SCOPED_TRACE("BN " + std::to_string(bn) + " cluster " + sm90::cluster_code_name(cl) +
                       (gather ? " gathered" : " in place") + (accumulate ? " accumulating" : " overwriting"));
          Guard guard;
          sm90::set_grouped_tile_n(bn);
          sm90::use_cluster_code(cl);
          sm90::set_grouped_wgrad_gather(gather);
          got[gather] = gpu_sets(*gpu_ops, sets, out, in, dw0, accumulate);
          EXPECT_CLOSE_REL(got[gather], ref, 1e-5);
        }
        EXPECT_CLOSE_REL(got[1], got[0], 1e-5);
      }
    }
  }
}

// Lockstep (set_grouped_wgrad_lockstep) only delays when a CTA starts its next item: dW bit for bit as without it,
// adding and storing, both tile widths, 1 CTA and both pairings, with tails gathered and in place; many items per
// CTA (6 experts of up to 4 x 4 tiles over 8 sets).
TEST(CudaExpertWgradGroup, LockstepChangesNoBit) {
  MXT_REQUIRE_SM90();
  auto gpu_ops = make_cuda_ops();
  const int64_t out = 512, in = 1024, E = 6;
  std::vector<RowSet> sets;
  for (int i = 0; i < 8; ++i)
    sets.push_back(make_set({40 + 9 * i, 130, 0, 64, 77 - 5 * i, 200}, i % 3, out, in, 501 + 2 * i));
  const auto dw0 = randn(E * out * in, 521);
  for (const bool accumulate : {true, false}) {
    for (int bn : {256, 128}) {
      for (int cl : {1, 2, 3}) {
        for (int gather : {1, 0}) {
          std::vector<float> got[2];
          for (int lockstep : {0, 1}) {
            SCOPED_TRACE("BN " + std::to_string(bn) + " cluster " + sm90::cluster_code_name(cl) +
                         (gather ? " gathered" : " in place") + (lockstep ? " lockstep" : "") +
                         (accumulate ? " accumulating" : " overwriting"));
            Guard guard;
            sm90::set_grouped_tile_n(bn);
            sm90::use_cluster_code(cl);
            sm90::set_grouped_wgrad_gather(gather);
            sm90::set_grouped_wgrad_lockstep(lockstep);
            got[lockstep] = gpu_sets(*gpu_ops, sets, out, in, dw0, accumulate);
          }
          EXPECT_EQ(bits_differ(got[0], got[1]), 0)
              << "BN " << bn << " cluster " << cl << (gather ? " gathered" : " in place")
              << ": dW values differ with lockstep";
        }
      }
    }
  }
}

// The wgrad raster's groups (set_grouped_wgrad_group) change only which CTA computes which tile, when: every
// group size gives the plain raster's sums bit for bit, along n (out > in: n-tiles fastest) and along m. Groups
// of 1, 2, 3 (a remainder group), 8, past the fast units' count, and the default's choice; 1 CTA and pairs over m-
// and n-tiles.
TEST(CudaExpertWgradGroup, RasterGroupsGiveThePlainRastersSums) {
  constexpr int kDefaultGroup = -1000;  // the default's choice (groups of 8 over these two row sets)
  MXT_REQUIRE_SM90();
  auto gpu_ops = make_cuda_ops();
  auto cpu_ops = make_cpu_ops();
  for (const auto& [out, in] : {std::pair<int64_t, int64_t>{1024, 1792}, {1792, 1024}}) {
    const std::vector<RowSet> sets = {make_set({130, 0, 77, 260}, 3, out, in, 91),
                                      make_set({64, 200, 1, 95}, 0, out, in, 93)};
    auto host_sets = sets;
    const auto dw0 = randn(4 * out * in, 95);
    const std::vector<float> ref = cpu_sets(*cpu_ops, host_sets, out, in, dw0, true);
    for (int cl : {1, 2, 3}) {
      std::vector<float> plain;
      for (int g : {0, 1, 2, 3, 8, 100, -3, kDefaultGroup}) {  // -3: groups of 3 with L2 hints
        SCOPED_TRACE("out " + std::to_string(out) + " in " + std::to_string(in) + " cluster " +
                     sm90::cluster_code_name(cl) + " group " + std::to_string(g));
        Guard guard;
        sm90::set_grouped_tile_n(256);
        sm90::use_cluster_code(cl);
        sm90::set_grouped_wgrad_group(g == kDefaultGroup ? -1 : g < 0 ? -g : g);
        sm90::set_grouped_l2_hints(g < 0 && g != kDefaultGroup ? sm90::kL2HintsAll : 0);
        const std::vector<float> got = gpu_sets(*gpu_ops, sets, out, in, dw0, true);
        if (g == 0) {
          EXPECT_CLOSE_REL(got, ref, 1e-5);
          plain = got;
          continue;
        }
        EXPECT_EQ(bits_differ(got, plain), 0) << "of " << got.size() << " dW values differ from the plain raster's";
      }
    }
  }
}

// The schedule's expert order (set_grouped_wgrad_order) changes only which CTA computes which tile, when. By
// decreasing k-blocks over all sets (ties by index) the launch records that order, and gives the index order's dW
// bit for bit, accumulating into fp32 and storing bf16 with the clipping norm's sums (their slots are per tile, so
// the norm too is bit for bit); 4 experts and 40 (several per lane, ties, empty experts), one CTA and pairs over m-
// and n-tiles, one row set and two.
TEST(CudaExpertWgradGroup, ExpertOrderGivesTheIndexOrdersSums) {
  MXT_REQUIRE_SM90();
  auto gpu = make_cuda_ops();
  struct Case {
    int64_t out, in;
    std::vector<std::vector<int32_t>> loads;
  };
  std::vector<int32_t> many_a, many_b;
  for (int e = 0; e < 40; ++e) {
    many_a.push_back(e % 7 == 3 ? 0 : (e * 37) % 150);  // equal k-blocks among several experts, some without rows
    many_b.push_back(e % 5 == 0 ? 0 : (e * 53) % 90);
  }
  const std::vector<Case> cases = {{1024, 1792, {{130, 0, 77, 260}, {64, 200, 1, 95}}},
                                   {1792, 1024, {{70, 300, 0, 129}}},
                                   {256, 384, {many_a, many_b}},
                                   {384, 256, {many_b}}};
  uint32_t seed = 800;
  for (const Case& c : cases) {
    std::vector<RowSet> sets;
    for (const auto& l : c.loads) sets.push_back(make_set(l, 2, c.out, c.in, seed += 2));
    const int E = static_cast<int>(c.loads[0].size());
    const auto dw0 = randn(static_cast<int64_t>(E) * c.out * c.in, seed + 1);
    const DeviceSets dev(*gpu, sets, c.out, c.in);
    for (int gather : {1, 0})
    for (int cl : {1, 2, 3}) {
      // The expected order: decreasing k-blocks over the sets, ties by index. Gathered (two sets or more), each
      // set keeps its whole 64-row blocks of an expert and the rest of all sets fills one more set's blocks.
      const bool gathered = gather && sets.size() >= 2;
      std::vector<int64_t> kb(E, 0), rest(E, 0);
      for (const auto& l : c.loads)
        for (int e = 0; e < E; ++e) {
          kb[e] += gathered ? l[e] / 64 : (l[e] + 63) / 64;
          rest[e] += l[e] % 64;
        }
      if (gathered)
        for (int e = 0; e < E; ++e) kb[e] += (rest[e] + 63) / 64;
      std::vector<int32_t> want_order(E);
      for (int e = 0; e < E; ++e) want_order[e] = e;
      std::stable_sort(want_order.begin(), want_order.end(), [&](int32_t a, int32_t b) { return kb[a] > kb[b]; });
      std::vector<float> acc_index, store_index;
      float norm_index = 0.f;
      for (int by_rows : {0, 1}) {
        SCOPED_TRACE("out " + std::to_string(c.out) + " in " + std::to_string(c.in) + " experts " +
                     std::to_string(E) + " sets " + std::to_string(sets.size()) + " cluster " +
                     sm90::cluster_code_name(cl) + (gather ? " gathered" : " in place") +
                     (by_rows ? " by rows" : " by index"));
        Guard guard;
        sm90::set_grouped_wgrad_gather(gather);
        sm90::set_grouped_tile_n(256);
        sm90::use_cluster_code(cl);
        sm90::set_grouped_wgrad_order(by_rows);
        sm90::record_wgrad_order(true);
        const std::vector<float> acc = gpu_sets(*gpu, sets, c.out, c.in, dw0, true);
        std::vector<int32_t> index_order(E);
        for (int e = 0; e < E; ++e) index_order[e] = e;
        EXPECT_EQ(sm90::recorded_wgrad_order(E), by_rows ? want_order : index_order);
        auto DW = upload(*gpu, dw0, DType::BF16, {E, c.out, c.in});
        auto ACC = upload(*gpu, std::vector<float>{0.5f}, DType::F32, {1});
        gpu->grouped_gemm_wgrad_sets_norm(dev.sets, DW, ACC);
        EXPECT_STREQ(sm90::last_grouped_impl(), "sm90");
        const std::vector<float> store = download(*gpu, DW);
        const float norm = download(*gpu, ACC)[0];
        if (!by_rows) {
          acc_index = acc;
          store_index = store;
          norm_index = norm;
          continue;
        }
        EXPECT_EQ(bits_differ(acc, acc_index), 0)
            << "of " << acc.size() << " accumulated dW values differ from the index order's";
        EXPECT_EQ(bits_differ(store, store_index), 0)
            << "of " << store.size() << " stored bf16 dW values differ from the index order's";
        EXPECT_EQ(std::memcmp(&norm, &norm_index, 4), 0) << norm << " against " << norm_index;
      }
    }
  }
}

// Where the Hopper kernel does not run (here: forced off), the op falls back to a zeroing when overwriting and
// one wmma call per set, with the same results.
TEST(CudaExpertWgradGroup, FallbackWithoutTheHopperKernel) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  auto cpu = make_cpu_ops();
  std::vector<RowSet> sets = {make_set({40, 0, 70}, 2, 64, 96, 81), make_set({0, 0, 0}, 1, 64, 96, 83),
                              make_set({5, 9, 130}, 0, 64, 96, 85)};
  const int64_t E = 3, out = 64, in = 96;
  const auto dw0 = randn(E * out * in, 87);
  for (const bool accumulate : {true, false}) {
    SCOPED_TRACE(accumulate ? "accumulating" : "overwriting");
    std::vector<float> ref = dw0;
    std::vector<Ops::WgradRowSet> host_sets;
    for (RowSet& r : sets) host_sets.push_back({host(r.dy, {r.R, out}), host(r.x, {r.R, in}), host_i32(r.off, {E + 1})});
    cpu->grouped_gemm_wgrad_sets(host_sets, host(ref, {E, out, in}), accumulate);
    const DeviceSets dev(*gpu, sets, out, in);
    auto DW = upload(*gpu, dw0, DType::F32, {E, out, in});
    sm90::set_grouped_impl(sm90::GroupedImpl::Wmma);
    gpu->grouped_gemm_wgrad_sets(dev.sets, DW, accumulate);
    const std::string impl = sm90::last_grouped_impl();
    sm90::set_grouped_impl(sm90::GroupedImpl::Auto);
    EXPECT_EQ(impl, "wmma");
    EXPECT_CLOSE_REL(download(*gpu, DW), ref, 1e-5);
  }
}

// Runs f once per kernel variant of a storing call: both tile widths, the three cluster codes, both epilogues.
template <typename F>
void for_each_store_variant(const std::string& what, F&& f) {
  for (int bn : {256, 128}) {
    for (int cl : {1, 2, 3}) {
      for (int tma : {1, 0}) {
        SCOPED_TRACE(what + " BN " + std::to_string(bn) + " cluster " + sm90::cluster_code_name(cl) +
                     (tma ? " TMA" : " direct"));
        Guard guard;
        sm90::set_grouped_tile_n(bn);
        sm90::use_cluster_code(cl);
        sm90::set_grouped_wgrad_tma(tma);
        f();
      }
    }
  }
}

// With the clipping norm (grouped_gemm_wgrad_sets_norm): dW bit for bit as the storing call writes it, and acc
// grown by sum(dW^2) (fp32 sums over each warp's 4,096 values, then fp64 over the slots: 1e-5 relative), at both
// tile widths, 1 CTA and pairs over m- and n-tiles (3 x 3 tiles: the last n-pair's second CTA has no tile), both
// epilogues; nine sets (two launches) take the store and a separate pass. MXTRAIN_GG_FAULT=norm fails it.
TEST(CudaExpertWgradGroup, NormSumsTheStoredSquares) {
  MXT_REQUIRE_SM90();
  auto gpu = make_cuda_ops();
  ASSERT_TRUE(gpu->sums_wgrad_norm());
  struct Case {
    int64_t out, in;
    int nsets;
  };
  for (const Case& c : {Case{136, 72, 2}, Case{384, 640, 3}, Case{128, 200, 9}}) {
    std::vector<RowSet> sets;
    for (int i = 0; i < c.nsets; ++i)
      sets.push_back(make_set({40 + 31 * i, i % 2 ? 0 : 66, 129 - 7 * i}, i % 3, c.out, c.in, 200 + 2 * i));
    const int64_t E = 3;
    const auto dw0 = randn(E * c.out * c.in, 300 + c.nsets);
    const DeviceSets dev(*gpu, sets, c.out, c.in);
    for_each_store_variant("out " + std::to_string(c.out) + " in " + std::to_string(c.in) + " sets " +
                               std::to_string(c.nsets), [&] {
      const std::vector<float> stored = gpu_sets(*gpu, sets, c.out, c.in, dw0, false);
      auto DW = upload(*gpu, dw0, DType::F32, {E, c.out, c.in});
      auto ACC = upload(*gpu, std::vector<float>{0.75f}, DType::F32, {1});
      sm90::note_grouped_impl("none");
      gpu->grouped_gemm_wgrad_sets_norm(dev.sets, DW, ACC);
      EXPECT_STREQ(sm90::last_grouped_impl(), "sm90");
      const std::vector<float> got = download(*gpu, DW);
      ASSERT_EQ(got.size(), stored.size());
      EXPECT_EQ(0, std::memcmp(got.data(), stored.data(), got.size() * sizeof(float)));
      double ref = 0.75;
      for (float v : got) ref += static_cast<double>(v) * v;
      EXPECT_NEAR(download(*gpu, ACC)[0], ref, 1e-5 * ref);
    });
  }
}

// A bf16 dW (expert_grad_dtype=bfloat16): the Hopper kernel's bf16 store is, bit for bit, its own fp32 store
// rounded to nearest even (the same sums, one rounding), and the norm sums the rounded values' squares (1e-5). At
// both tile widths, every cluster code, both epilogues, with an expert empty in every set (zeros), loads that are
// not multiples of the k-block, dW rows not a multiple of the tile. MXTRAIN_GG_FAULT=bf16swap fails it.
TEST(CudaExpertWgradGroup, Bf16StoreIsTheRoundedF32Store) {
  MXT_REQUIRE_SM90();
  auto gpu = make_cuda_ops();
  struct Case {
    int64_t out, in;
    int nsets;
  };
  for (const Case& c : {Case{136, 72, 2}, Case{384, 640, 3}, Case{128, 200, 1}}) {
    std::vector<RowSet> sets;
    for (int i = 0; i < c.nsets; ++i)
      sets.push_back(make_set({40 + 31 * i, 0, 129 - 7 * i, 70}, i % 3, c.out, c.in, 500 + 2 * i));
    const int64_t E = 4;
    const auto dw0 = randn(E * c.out * c.in, 600 + c.nsets);
    const DeviceSets dev(*gpu, sets, c.out, c.in);
    for_each_store_variant("out " + std::to_string(c.out) + " in " + std::to_string(c.in) + " sets " +
                               std::to_string(c.nsets), [&] {
      std::vector<float> want = gpu_sets(*gpu, sets, c.out, c.in, dw0, false);
      round_bf16(want);
      auto DW = upload(*gpu, dw0, DType::BF16, {E, c.out, c.in});
      auto ACC = upload(*gpu, std::vector<float>{0.5f}, DType::F32, {1});
      sm90::note_grouped_impl("none");
      gpu->grouped_gemm_wgrad_sets_norm(dev.sets, DW, ACC);
      EXPECT_STREQ(sm90::last_grouped_impl(), "sm90");
      const std::vector<float> got = download(*gpu, DW);
      ASSERT_EQ(got.size(), want.size());
      int64_t differ = 0;
      for (size_t i = 0; i < got.size(); ++i) differ += got[i] != want[i];
      EXPECT_EQ(differ, 0) << "of " << got.size();
      for (int64_t i = c.out * c.in; i < 2 * c.out * c.in; ++i) ASSERT_EQ(got[i], 0.f) << "expert 1 has no rows";
      double ref = 0.5;
      for (float v : got) ref += static_cast<double>(v) * v;
      EXPECT_NEAR(download(*gpu, ACC)[0], ref, 1e-5 * ref);
      // Without the norm, the same bits.
      auto DW2 = upload(*gpu, dw0, DType::BF16, {E, c.out, c.in});
      gpu->grouped_gemm_wgrad_sets(dev.sets, DW2, false);
      EXPECT_EQ(download(*gpu, DW2), got);
    });
  }
}

// The bf16 store's epilogue forms: one named barrier per box (the default since session 61) or two (the form before
// it), each with per-word st.shared or stmatrix writes (session 72): the same dW bits and the same norm as two
// barriers with words, with and without the norm, at both tile widths and every cluster code, over more tiles per
// CTA than the three boxes cycle through (each box reused across items), with an expert that has no rows in any set
// (its zeros go through the boxes too) and dW rows that end 24 rows into the last tile.
TEST(CudaExpertWgradGroup, Bf16EpilogueFormsChangeNoBit) {
  MXT_REQUIRE_SM90();
  auto gpu = make_cuda_ops();
  const int64_t out = 1304, in = 1536, E = 5;
  std::vector<RowSet> sets{make_set({300, 0, 129, 64, 700}, 3, out, in, 900),
                           make_set({33, 0, 400, 250, 5}, 0, out, in, 902)};
  const DeviceSets dev(*gpu, sets, out, in);
  const auto dw0 = randn(E * out * in, 904);
  for (int bn : {256, 128})
    for (int cl : {1, 2, 3})
      for (bool with_norm : {false, true}) {
        std::vector<float> first;
        float first_norm = 0.f;
        for (const auto& [bars, stm] : {std::pair{2, 0}, std::pair{1, 0}, std::pair{1, 1}, std::pair{2, 1}}) {
          SCOPED_TRACE("BN " + std::to_string(bn) + " cluster " + sm90::cluster_code_name(cl) +
                       (with_norm ? " with norm" : " no norm") + " barriers " + std::to_string(bars) +
                       (stm ? " stmatrix" : " words"));
          Guard guard;
          sm90::set_grouped_tile_n(bn);
          sm90::use_cluster_code(cl);
          sm90::set_grouped_wgrad_tma(1);
          sm90::set_grouped_wgrad_epi_bars(bars);
          sm90::set_grouped_wgrad_epi_stmatrix(stm);
          auto DW = upload(*gpu, dw0, DType::BF16, {E, out, in});
          auto ACC = upload(*gpu, std::vector<float>{0.5f}, DType::F32, {1});
          sm90::note_grouped_impl("none");
          if (with_norm)
            gpu->grouped_gemm_wgrad_sets_norm(dev.sets, DW, ACC);
          else
            gpu->grouped_gemm_wgrad_sets(dev.sets, DW, false);
          EXPECT_STREQ(sm90::last_grouped_impl(), "sm90");
          const std::vector<float> got = download(*gpu, DW);
          const float nrm = download(*gpu, ACC)[0];
          for (int64_t i = out * in; i < 2 * out * in; ++i) ASSERT_EQ(got[i], 0.f) << "expert 1 has no rows";
          if (bars == 2 && !stm) {
            first = got;
            first_norm = nrm;
            continue;
          }
          EXPECT_EQ(bits_differ(got, first), 0)
              << "of " << got.size() << " dW values differ from the two-barrier per-word form's";
          EXPECT_EQ(std::memcmp(&nrm, &first_norm, 4), 0) << nrm << " against " << first_norm;
        }
      }
}

// Where the Hopper kernel does not run (here: the wmma implementation forced), a bf16 dW is made expert by expert
// through an fp32 scratch: the rounded wmma fp32 store, bit for bit, its squares in the norm, and an empty call
// (no row sets) leaves zeros. Accumulating into a bf16 dW is refused.
TEST(CudaExpertWgradGroup, Bf16StoreFallbackIsTheRoundedF32Store) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  std::vector<RowSet> sets{make_set({33, 0, 90}, 2, 64, 96, 700), make_set({5, 9, 130}, 0, 64, 96, 702)};
  const int64_t E = 3, out = 64, in = 96;
  const auto dw0 = randn(E * out * in, 704);
  const DeviceSets dev(*gpu, sets, out, in);
  sm90::set_grouped_impl(sm90::GroupedImpl::Wmma);
  auto F = upload(*gpu, dw0, DType::F32, {E, out, in});
  gpu->grouped_gemm_wgrad_sets(dev.sets, F, false);
  std::vector<float> want = download(*gpu, F);
  round_bf16(want);
  auto DW = upload(*gpu, dw0, DType::BF16, {E, out, in});
  auto ACC = upload(*gpu, std::vector<float>{0.25f}, DType::F32, {1});
  gpu->grouped_gemm_wgrad_sets_norm(dev.sets, DW, ACC);
  const std::string impl = sm90::last_grouped_impl();
  auto EMPTY = upload(*gpu, dw0, DType::BF16, {E, out, in});
  gpu->grouped_gemm_wgrad_sets({}, EMPTY, false);
  sm90::set_grouped_impl(sm90::GroupedImpl::Auto);
  EXPECT_EQ(impl, "wmma");
  const std::vector<float> got = download(*gpu, DW);
  EXPECT_EQ(got, want);
  double ref = 0.25;
  for (float v : got) ref += static_cast<double>(v) * v;
  EXPECT_NEAR(download(*gpu, ACC)[0], ref, 1e-6 * ref);
  EXPECT_EQ(download(*gpu, EMPTY), std::vector<float>(dw0.size(), 0.f));
  EXPECT_THROW(gpu->grouped_gemm_wgrad_sets(dev.sets, DW, true), std::exception);
}

TrainedRun train(int64_t group, int64_t acc, bool graphs, const std::string& grad_dtype = "float32") {
  TrainConfig c = tiny_config("mxtrain_test_cuda_expert_wgrad_group", 64, 128);
  c.num_train_steps = 6;
  c.grad_acc_steps = acc;
  c.lr_scheduler = {2, 4, 0.1};
  c.expert_wgrad_micro_batches = group;
  c.cuda_graphs = graphs;
  c.expert_grad_dtype = grad_dtype;
  auto gpu = make_cuda_ops();
  return train_to_end(c, *gpu);
}

// The trainer with groups of 2 and of the whole step follows the ungrouped run (eager and replayed graphs; an
// odd accumulation count leaves a short last group): only fp32 summation order differs in the expert gradients.
TEST(CudaExpertWgradGroup, TrainingFollowsTheUngroupedRun) {
  MXT_REQUIRE_GPU();
  for (const int64_t acc : {2, 3}) {
    for (const bool graphs : {false, true}) {
      const TrainedRun off = train(1, acc, graphs);
      EXPECT_LT(off.losses.back(), off.losses.front());
      for (const int64_t group : {int64_t{2}, acc}) {
        SCOPED_TRACE("grad_acc_steps " + std::to_string(acc) + ", group " + std::to_string(group) +
                     (graphs ? ", cuda_graphs" : ", eager"));
        const TrainedRun on = train(group, acc, graphs);
        ASSERT_EQ(off.losses.size(), on.losses.size());
        EXPECT_EQ(off.losses.front(), on.losses.front());  // the first step's forward sees the same weights
        for (size_t i = 0; i < off.losses.size(); ++i)
          EXPECT_NEAR(on.losses[i], off.losses[i], 1e-3 * std::abs(off.losses[i])) << "step " << i + 1;
        EXPECT_LT(rel_l2(on.expert, off.expert), 1e-3);
      }
    }
  }
}

// expert_grad_dtype=bfloat16 follows the fp32 gradients' run (eager and graphs): the expert gradients differ by
// one bf16 rounding (2^-9 relative), which AdamW's normalised step carries into the weights at about that size.
TEST(CudaExpertWgradGroup, Bf16ExpertGradsFollowTheF32Run) {
  MXT_REQUIRE_GPU();
  for (const bool graphs : {false, true}) {
    SCOPED_TRACE(graphs ? "cuda_graphs" : "eager");
    const TrainedRun f32 = train(2, 2, graphs);
    const TrainedRun b16 = train(2, 2, graphs, "bfloat16");
    ASSERT_EQ(f32.losses.size(), b16.losses.size());
    EXPECT_EQ(f32.losses.front(), b16.losses.front());
    for (size_t i = 0; i < f32.losses.size(); ++i)
      EXPECT_NEAR(b16.losses[i], f32.losses[i], 2e-3 * std::abs(f32.losses[i])) << "step " << i + 1;
    const double d = rel_l2(b16.expert, f32.expert);
    EXPECT_GT(d, 0.0);  // the gradients were rounded
    EXPECT_LT(d, 1e-2);
    EXPECT_LT(rel_l2(b16.dense, f32.dense), 1e-2);
  }
}

}  // namespace
}  // namespace mxt::testing
