// The weight gradient's gathered tail set (mxtrain/wgrad_tails.hpp), on the host: which rows leave a set, where each
// lands (grouped by expert, set order within, no gaps or overlaps), and the capacity and bytes the buffers and the
// memory plan reserve.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "mxtrain/wgrad_tails.hpp"

namespace mxt {
namespace {

TEST(WgradTails, RowsPastTheLastWholeKBlockLeave) {
  EXPECT_EQ(wgrad_tail_rows(0, 0), 0);
  EXPECT_EQ(wgrad_tail_rows(10, 10), 0);
  EXPECT_EQ(wgrad_tail_rows(5, 6), 1);
  EXPECT_EQ(wgrad_tail_rows(3, 66), 63);
  EXPECT_EQ(wgrad_tail_rows(3, 67), 0);     // 64 rows: one whole k-block
  EXPECT_EQ(wgrad_tail_rows(100, 229), 1);  // 129 rows
  EXPECT_EQ(wgrad_tail_rows(9, 4), 0);      // an empty range either way
}

TEST(WgradTails, LayoutGroupsByExpertInSetOrder) {
  std::mt19937 rng(7);
  for (const auto& [sets, E] : {std::pair<int, int>{1, 1}, {2, 3}, {8, 8}, {5, 100}, {8, 256}}) {
    std::vector<int32_t> r(static_cast<size_t>(sets * E)), off(static_cast<size_t>(E + 1)), dst(r.size(), -1);
    for (auto& v : r) v = static_cast<int32_t>(rng() % 3 == 0 ? 0 : rng() % 64);
    wgrad_tail_layout(r.data(), sets, E, off.data(), dst.data());
    // Expert e's tails fill [off[e], off[e + 1]) set after set, so the tail rows cover [0, off[E]) once each.
    std::vector<int> seen(static_cast<size_t>(off[E]), 0);
    int32_t next = 0;
    for (int e = 0; e < E; ++e) {
      ASSERT_EQ(off[e], next) << "sets " << sets << " E " << E << " expert " << e;
      for (int s = 0; s < sets; ++s) {
        const int i = s * E + e;
        ASSERT_EQ(dst[i], next) << "sets " << sets << " E " << E << " set " << s << " expert " << e;
        for (int32_t j = 0; j < r[i]; ++j) ++seen[static_cast<size_t>(dst[i] + j)];
        next += r[i];
      }
    }
    ASSERT_EQ(off[E], next);
    for (size_t j = 0; j < seen.size(); ++j) EXPECT_EQ(seen[j], 1) << "tail row " << j;
    EXPECT_LE(off[E], wgrad_tail_capacity(sets, E));
  }
}

TEST(WgradTails, CapacityAndBytes) {
  // 8 micro-batches' sets of 8 experts: at most 63 rows each leave.
  EXPECT_EQ(wgrad_tail_capacity(8, 8), 8 * 8 * 63);
  std::vector<int32_t> full(64, 63), off(9), dst(64);
  wgrad_tail_layout(full.data(), 8, 8, off.data(), dst.data());
  EXPECT_EQ(off[8], wgrad_tail_capacity(8, 8));
  // 8x7B's W13 call: dy 28,672 and x 4,096 bf16 columns, then the offsets (256 bytes) and the copy plan.
  EXPECT_EQ(wgrad_tail_bytes(8, 8, 28672 + 4096), int64_t{4032} * 32768 * 2 + 256 + 64 * 12);
  EXPECT_EQ(wgrad_tail_offset_ints(8), 64);
  EXPECT_EQ(wgrad_tail_offset_ints(63), 64);
  EXPECT_EQ(wgrad_tail_offset_ints(64), 128);  // E + 1 = 65 ints
  EXPECT_EQ(wgrad_tail_offset_ints(256), 320);
}

}  // namespace
}  // namespace mxt
