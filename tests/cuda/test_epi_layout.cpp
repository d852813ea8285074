// The bf16 weight-gradient epilogue's box writes (sm90_epi_layout.hpp), checked on the host: the stmatrix.x2 form
// puts every accumulator pair of every thread at the byte the per-word st.shared form puts it, covers each byte of
// the 64 x 32 bf16 box once, and rounds the pairs in the same order. No GPU needed.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <tuple>
#include <vector>

#include "sm90_epi_layout.hpp"

namespace mxt::sm90 {
namespace {

using Value = std::tuple<int, int, int>;  // (warp, lane, accumulator index of the pair's first value within the box)

// The per-word form (grouped_gemm_sm90.cu): thread (warp, lane) holds rows warp * 16 + lane / 4 and + 8; its pair at
// accumulator 4 * jj (+ 2 for the second row) goes to word 4 * jj + lane % 4 of that row.
std::map<uint32_t, Value> word_form() {
  std::map<uint32_t, Value> at;
  for (int warp = 0; warp < 4; ++warp)
    for (int lane = 0; lane < 32; ++lane) {
      const int r0 = warp * 16 + lane / 4;
      for (int jj = 0; jj < 4; ++jj) {
        const int word = 4 * jj + lane % 4;
        EXPECT_TRUE(at.emplace(sw64_offset(r0, word), Value{warp, lane, 4 * jj}).second);
        EXPECT_TRUE(at.emplace(sw64_offset(r0 + 8, word), Value{warp, lane, 4 * jj + 2}).second);
      }
    }
  return at;
}

// stmatrix.m8n8.x2 as PTX defines it: lane 8i + r (i < 2) gives the address of row r of matrix i (16 bytes); register
// i of lane t is matrix i's row t / 4, columns 2 * (t % 4) and + 1, so its 4 bytes go to that row's address +
// 4 * (t % 4).
std::map<uint32_t, Value> stmatrix_form() {
  std::map<uint32_t, Value> at;
  for (int warp = 0; warp < 4; ++warp)
    for (int j = 0; j < 4; ++j)
      for (int i = 0; i < 2; ++i)
        for (int t = 0; t < 32; ++t) {
          const uint32_t row_addr = stmatrix_box_offset(warp, 8 * i + t / 4, j);
          EXPECT_EQ(row_addr % 16, 0u) << "stmatrix rows are 16-byte aligned";
          EXPECT_TRUE(at.emplace(row_addr + 4 * (t % 4), Value{warp, t, stmatrix_acc(j, i)}).second);
        }
  return at;
}

TEST(EpiLayout, StmatrixBoxMatchesTheWordStores) {
  const auto words = word_form();
  const auto stm = stmatrix_form();
  ASSERT_EQ(words.size(), 64u * 64u / 4u) << "the per-word form fills the 4 KB box";
  ASSERT_EQ(stm.size(), words.size());
  for (const auto& [addr, v] : words) {
    ASSERT_LT(addr, 4096u);
    const auto it = stm.find(addr);
    ASSERT_NE(it, stm.end()) << "byte " << addr << " not written by the stmatrix form";
    EXPECT_EQ(it->second, v) << "byte " << addr;
  }
}

// The norm's squares add up pair by pair as the pairs are rounded: the stmatrix form's (j, i) order must be the
// per-word form's (jj, row half) order, accumulators 0, 2, 4, ..., 14 of the box.
TEST(EpiLayout, StmatrixRoundsPairsInTheWordOrder) {
  std::vector<int> order;
  for (int j = 0; j < 4; ++j)
    for (int i = 0; i < 2; ++i) order.push_back(stmatrix_acc(j, i));
  EXPECT_EQ(order, (std::vector<int>{0, 2, 4, 6, 8, 10, 12, 14}));
}

// The kernel keeps one offset register: store j's row addresses are store 0's XOR 16 j.
TEST(EpiLayout, StmatrixStoresAreTheFirstXorPiece) {
  for (int warp = 0; warp < 4; ++warp)
    for (int lane = 0; lane < 32; ++lane)
      for (int j = 0; j < 4; ++j)
        EXPECT_EQ(stmatrix_box_offset(warp, lane, j), stmatrix_box_offset(warp, lane, 0) ^ (16u * j))
            << "warp " << warp << " lane " << lane << " store " << j;
}

// Each stmatrix phase (the 8 rows of one matrix) hits 8 different 16-byte bank groups: no bank conflicts.
TEST(EpiLayout, StmatrixRowsOfAMatrixUseDistinctBanks) {
  for (int warp = 0; warp < 4; ++warp)
    for (int j = 0; j < 4; ++j)
      for (int i = 0; i < 2; ++i) {
        std::set<uint32_t> groups;
        for (int r = 0; r < 8; ++r) groups.insert(stmatrix_box_offset(warp, 8 * i + r, j) % 128 / 16);
        EXPECT_EQ(groups.size(), 8u) << "warp " << warp << " store " << j << " matrix " << i;
      }
}

}  // namespace
}  // namespace mxt::sm90
