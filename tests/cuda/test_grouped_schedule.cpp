// The Hopper grouped GEMMs' forward / dgrad work units (sm90_row_units.hpp), checked on the host: every (m-tile,
// n-tile) of an expert exactly once, the pair layouts the producer's loads assume, and no CTA without rows where
// an odd last m-tile can run over two n-tiles. No GPU needed.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>
#include <utility>

#include "sm90_row_units.hpp"

namespace mxt::sm90 {
namespace {

TEST(GroupedSchedule, RowUnitsCoverEveryTileOnceInPairLayouts) {
  for (int cl : {1, 2}) {
    for (bool odd_tail : {false, true}) {
      for (int mt = 0; mt <= 9; ++mt) {
        for (int nt = 1; nt <= 8; ++nt) {
          SCOPED_TRACE("cl=" + std::to_string(cl) + " odd_tail=" + std::to_string(odd_tail) +
                       " mt=" + std::to_string(mt) + " nt=" + std::to_string(nt));
          const int units = row_units_of_expert(mt, nt, cl, odd_tail);
          std::map<std::pair<int, int>, int> seen;
          int idle = 0, last_pair_of_n = 0;
          for (int local = 0; local < units; ++local) {
            const RowUnit u0 = row_unit(local, mt, nt, cl, odd_tail, 0);
            const RowUnit u1 = row_unit(local, mt, nt, cl, odd_tail, cl - 1);
            for (int rank = 0; rank < cl; ++rank) {
              const RowUnit& u = rank == 0 ? u0 : u1;
              ASSERT_GE(u.n_tile, 0);
              ASSERT_LT(u.n_tile, nt);
              ASSERT_GE(u.m_tile, 0);
              if (u.m_tile < mt)
                ++seen[{u.m_tile, u.n_tile}];
              else
                ++idle;
            }
            if (cl == 2) {
              EXPECT_EQ(u0.shared_b, u1.shared_b);
              if (u0.shared_b) {  // adjacent m-tiles of one n-tile
                EXPECT_EQ(u1.n_tile, u0.n_tile);
                EXPECT_EQ(u1.m_tile, u0.m_tile + 1);
              } else {            // one m-tile over adjacent n-tiles
                EXPECT_EQ(u1.m_tile, u0.m_tile);
                EXPECT_EQ(u1.n_tile, u0.n_tile + 1);
              }
            } else {
              EXPECT_FALSE(u0.shared_b);
            }
            if (pairs_odd_tail(mt, nt, cl, odd_tail)) {  // units walk pairs of n-tiles in order
              EXPECT_GE(u0.n_tile / 2, last_pair_of_n);
              last_pair_of_n = u0.n_tile / 2;
            }
          }
          EXPECT_EQ(static_cast<int>(seen.size()), mt * nt);
          for (const auto& [tile, n] : seen) EXPECT_EQ(n, 1) << "m-tile " << tile.first << " n-tile " << tile.second;
          EXPECT_EQ(idle, cl * units - mt * nt);
          // Pairs leave a CTA idle only for an odd m-tile count, and then not where n-tiles pair up.
          const bool can_pair = cl == 2 && odd_tail && nt % 2 == 0;
          if (can_pair) EXPECT_EQ(idle, 0);
          if (cl == 2 && !can_pair) EXPECT_EQ(idle, (mt % 2) * nt);
        }
      }
    }
  }
}

// The wgrad raster: every (fast, slow) unit exactly once for any group size, and within a group the slow index
// moves only after the group's fast units (at most g distinct fast units among any g * ns consecutive items of a
// full group).
TEST(GroupedSchedule, WgradRasterGroupsCoverEveryUnitOnce) {
  for (int nf = 1; nf <= 17; ++nf) {
    for (int ns = 1; ns <= 6; ++ns) {
      for (int g : {0, 1, 2, 3, 4, 8, 16, 40}) {
        SCOPED_TRACE("nf=" + std::to_string(nf) + " ns=" + std::to_string(ns) + " g=" + std::to_string(g));
        const int ge = g <= 0 || g > nf ? nf : g;
        std::map<std::pair<int, int>, int> seen;
        for (int local = 0; local < nf * ns; ++local) {
          const WgradUnit u = wgrad_unit(local, nf, ns, g);
          ASSERT_GE(u.fast, 0);
          ASSERT_LT(u.fast, nf);
          ASSERT_GE(u.slow, 0);
          ASSERT_LT(u.slow, ns);
          ++seen[{u.fast, u.slow}];
          // the group of item `local` holds fast units [gi * ge, gi * ge + ge)
          const int gi = local / (ge * ns);
          EXPECT_EQ(u.fast / ge, gi);
          if (local > 0) {  // within a group: fast fastest, then slow
            const WgradUnit v = wgrad_unit(local - 1, nf, ns, g);
            if (v.fast / ge == gi) EXPECT_TRUE(u.slow == v.slow ? u.fast == v.fast + 1 : u.slow == v.slow + 1);
          }
        }
        EXPECT_EQ(static_cast<int>(seen.size()), nf * ns);
        for (const auto& [unit, n] : seen) EXPECT_EQ(n, 1) << "fast " << unit.first << " slow " << unit.second;
        if (g <= 0 || g >= nf)  // one group: the plain raster
          for (int local = 0; local < nf * ns; ++local) {
            EXPECT_EQ(wgrad_unit(local, nf, ns, g).fast, local % nf);
            EXPECT_EQ(wgrad_unit(local, nf, ns, g).slow, local / nf);
          }
      }
    }
  }
}

// The last round's split (tail_split): every unit's k-blocks exactly once, whole units first, each split unit's parts
// in consecutive contiguous ranges of at least 2 k-blocks, no more rounds than without the split, and the split
// taken wherever it shortens the last round (at least 2 parts fit) and nowhere else.
TEST(GroupedSchedule, TailSplitCoversEveryKBlockOnceInTheSameRounds) {
  for (int clusters : {1, 2, 7, 66, 132}) {
    for (int units = 0; units <= 3 * clusters + 5; ++units) {
      for (int nk : {1, 2, 3, 5, 16, 64, 448}) {
        for (int max_parts : {0, 1, 2, 3, 8}) {
          SCOPED_TRACE("clusters=" + std::to_string(clusters) + " units=" + std::to_string(units) +
                       " nk=" + std::to_string(nk) + " max_parts=" + std::to_string(max_parts));
          const TailSplit ts = tail_split(units, clusters, nk, max_parts);
          const int r = units % clusters;
          const int fit = r > 0 ? std::min(std::min(clusters / r, max_parts), nk / 2) : 0;
          if (fit >= 2) {
            EXPECT_EQ(ts.parts, fit);
            EXPECT_EQ(ts.full, units - r);
          } else {
            EXPECT_EQ(ts.parts, 1);
            EXPECT_EQ(ts.full, units);
          }
          EXPECT_EQ(ts.items, ts.full + (units - ts.full) * ts.parts);
          EXPECT_LE(ts.items - ts.full, clusters);  // the split items make one round
          EXPECT_EQ((ts.items + clusters - 1) / clusters, (units + clusters - 1) / clusters);
          std::vector<int> covered(static_cast<size_t>(units), 0);
          for (int item = 0; item < ts.items; ++item) {
            if (item < ts.full) {
              covered[item] += nk;
              continue;
            }
            const int slot = item - ts.full, unit = ts.full + slot / ts.parts, part = slot % ts.parts;
            int kb0 = -1, kb1 = -1;
            tail_part_range(nk, part, ts.parts, kb0, kb1);
            EXPECT_GE(kb1 - kb0, 2);
            int prev0 = 0, prev1 = 0;
            if (part > 0) tail_part_range(nk, part - 1, ts.parts, prev0, prev1);
            EXPECT_EQ(kb0, part > 0 ? prev1 : 0);  // contiguous, in part order
            if (part == ts.parts - 1) EXPECT_EQ(kb1, nk);
            covered[unit] += kb1 - kb0;
          }
          for (int u = 0; u < units; ++u) EXPECT_EQ(covered[u], nk) << "unit " << u;
        }
      }
    }
  }
}

}  // namespace
}  // namespace mxt::sm90
