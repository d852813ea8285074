#pragma once
// Expert placement under expert parallelism (parallelism.ep_rebalance_interval). EP rank r holds a layer's
// slots [r*El, (r+1)*El); the busiest rank's routed rows are the layer's critical path. Re-placing experts
// relabels them: the new slot g holds the expert that was at slot src[g], its router row, weights and AdamW
// moments moved together, so the model computes the same function (a permutation symmetry of the MoE layer).
// The choice is pure and deterministic, so every rank of an EP group computes the same one from the same counts.
#include <cstdint>
#include <vector>

namespace mxt {

// Rows on the busiest EP rank for per-slot rows (size E, E divisible by ep_size).
int64_t busiest_rank_rows(const std::vector<int64_t>& rows, int ep_size);

struct ExpertMoves {
  std::vector<int> src;       // [E]: the slot whose expert the new slot g holds (identity: nothing moves)
  int64_t busiest_before = 0, busiest_after = 0;
  int moved = 0;              // slots whose expert changes (every move crosses ranks)
};

// A placement that lowers the busiest rank's rows: largest experts first onto the least loaded rank with a free
// slot, then pairwise swaps out of the busiest rank while they help; the new groups go to the ranks that already
// hold most of them, and an expert that stays on its rank keeps its slot. Returns the identity unless the busiest
// rank's rows fall by at least min_gain (a fraction: 0.03 = 3%), so that small gains move nothing.
// same_slot: every expert keeps its local slot index (it moves only between slot j of one rank and slot j of
// another), so that state sharded by flat range over data-parallel replicas moves within one replica index.
ExpertMoves balance_experts(const std::vector<int64_t>& rows, int ep_size, double min_gain, bool same_slot = false);

}  // namespace mxt
