// The attention backward's dS tile layout (mxtrain/attention_ds.hpp), on the host: every block the dK/dV kernel
// visits gets its own tile, the tiles fill [0, tiles_per_head) without gaps, and the sizes the memory plan counts.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "mxtrain/attention_ds.hpp"

namespace mxt {
namespace {

TEST(AttentionDsTiles, EveryVisitedBlockHasItsOwnTile) {
  for (int64_t S : {128, 256, 384, 1024, 4096}) {
    const int64_t nb = S / 64, n = attention_ds_tiles_per_head(nb);
    std::vector<int> seen(static_cast<size_t>(n), 0);
    int64_t visited = 0;
    // The dK/dV kernel: CTAs of 128 keys (key blocks 2t and 2t + 1), each over the 64-query blocks from 2t on.
    for (int64_t t = 0; t < nb / 2; ++t)
      for (int64_t kb = 2 * t; kb < 2 * t + 2; ++kb)
        for (int64_t qb = 2 * t; qb < nb; ++qb) {
          const int64_t i = attention_ds_tile(nb, kb, qb);
          ASSERT_GE(i, 0) << "S " << S << " kb " << kb << " qb " << qb;
          ASSERT_LT(i, n) << "S " << S << " kb " << kb << " qb " << qb;
          ++seen[static_cast<size_t>(i)];
          ++visited;
        }
    EXPECT_EQ(visited, n) << "S " << S;
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(seen[static_cast<size_t>(i)], 1) << "S " << S << " tile " << i;
    // The dQ kernel's CTA of queries [q0, q0 + 128) reads key blocks 0 .. q0 / 64 + 1 for both query blocks.
    for (int64_t q0 = 0; q0 < S; q0 += 128)
      for (int64_t kb = 0; kb <= q0 / 64 + 1; ++kb)
        EXPECT_GE(q0 / 64, 2 * (kb / 2)) << "S " << S << ": dQ reads a tile dK/dV never writes";
  }
}

TEST(AttentionDsTiles, BytesWhereTheShapeAllows) {
  // seq 4096, 32 heads: 2,112 tiles of 8 KiB per head.
  EXPECT_EQ(attention_ds_bytes(1, 4096, 32, 128), int64_t{32} * 2112 * 8192);
  EXPECT_EQ(attention_ds_bytes(2, 256, 4, 128), int64_t{2} * 4 * (4 * 4 / 2 + 4) * 8192);
  EXPECT_EQ(attention_ds_bytes(1, 4096, 32, 64), int64_t{32} * 2112 * 8192);  // the tiles do not depend on D
  EXPECT_EQ(attention_ds_bytes(1, 4096, 32, 32), 0);   // head_dim 32: the recomputing kernels
  EXPECT_EQ(attention_ds_bytes(1, 4032, 32, 128), 0);  // seq not a multiple of 128
  EXPECT_EQ(attention_ds_bytes(1, 8192, 32, 128), 0);  // 2.2 GB: over kAttentionDsMaxBytes
  EXPECT_GT(attention_ds_bytes(1, 8192, 16, 128), 0);
  // The reasons the backward names when MXTRAIN_ATTENTION_DS=on cannot apply.
  EXPECT_EQ(attention_ds_why_not(1, 4096, 32, 128), "");
  EXPECT_NE(attention_ds_why_not(1, 300, 4, 128).find("seq 300"), std::string::npos);
  EXPECT_NE(attention_ds_why_not(1, 4096, 4, 32).find("head_dim 32"), std::string::npos);
  EXPECT_NE(attention_ds_why_not(1, 8192, 32, 128).find("more than 2048 MiB"), std::string::npos);
}

}  // namespace
}  // namespace mxt
