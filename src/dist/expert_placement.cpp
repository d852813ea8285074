#include "mxtrain/expert_placement.hpp"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>

namespace mxt {

namespace {

void check_shape(const std::vector<int64_t>& rows, int ep_size) {
  const int64_t E = static_cast<int64_t>(rows.size());
  if (ep_size < 1 || E == 0 || E % ep_size != 0)
    throw std::invalid_argument("expert placement: " + std::to_string(E) + " experts over " +
                                std::to_string(ep_size) + " EP ranks");
}

// Rows per group of a partition (group[e] = the group of expert e).
std::vector<int64_t> group_rows(const std::vector<int64_t>& rows, const std::vector<int>& group, int groups) {
  std::vector<int64_t> load(static_cast<size_t>(groups), 0);
  for (size_t e = 0; e < rows.size(); ++e) load[static_cast<size_t>(group[e])] += rows[e];
  return load;
}

}  // namespace

int64_t busiest_rank_rows(const std::vector<int64_t>& rows, int ep_size) {
  check_shape(rows, ep_size);
  const int64_t El = static_cast<int64_t>(rows.size()) / ep_size;
  int64_t busiest = 0;
  for (int r = 0; r < ep_size; ++r)
    busiest = std::max(busiest, std::accumulate(rows.begin() + r * El, rows.begin() + (r + 1) * El, int64_t{0}));
  return busiest;
}

namespace {

// same_slot: per slot index j, a permutation of its P experts over the ranks. Columns with the widest spread
// first, each expert (largest first) to the least loaded rank still free in that column (ties: its own rank);
// then swaps within a column between the busiest rank and another while they help.
ExpertMoves balance_same_slot(const std::vector<int64_t>& rows, int P, double min_gain, ExpertMoves m) {
  const int E = static_cast<int>(rows.size()), El = E / P;
  std::vector<int> cols(static_cast<size_t>(El));
  std::iota(cols.begin(), cols.end(), 0);
  auto spread = [&](int j) {
    int64_t lo = rows[j], hi = rows[j];
    for (int r = 0; r < P; ++r) lo = std::min(lo, rows[r * El + j]), hi = std::max(hi, rows[r * El + j]);
    return hi - lo;
  };
  std::stable_sort(cols.begin(), cols.end(), [&](int a, int b) { return spread(a) > spread(b); });
  std::vector<int> rank_of(static_cast<size_t>(E));  // new rank of the expert now at slot e
  std::vector<int64_t> load(static_cast<size_t>(P), 0);
  for (int j : cols) {
    std::vector<int> order(static_cast<size_t>(P));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return rows[a * El + j] > rows[b * El + j]; });
    std::vector<bool> used(static_cast<size_t>(P), false);
    for (int r : order) {
      int best = -1;
      for (int q = 0; q < P; ++q) {
        if (used[q]) continue;
        if (best < 0 || load[q] < load[best] || (load[q] == load[best] && q == r)) best = q;
      }
      used[best] = true;
      rank_of[r * El + j] = best;
      load[best] += rows[r * El + j];
    }
  }
  auto loads = [&] {
    std::vector<int64_t> l(static_cast<size_t>(P), 0);
    for (int e = 0; e < E; ++e) l[rank_of[e]] += rows[e];
    return l;
  };
  for (int iter = 0; iter < 4 * E * E; ++iter) {
    load = loads();
    const int b = static_cast<int>(std::max_element(load.begin(), load.end()) - load.begin());
    int64_t best_peak = load[b];
    int bi = -1, bk = -1;
    for (int i = 0; i < E; ++i) {
      if (rank_of[i] != b) continue;
      for (int k = i % El; k < E; k += El) {  // the same column
        const int c = rank_of[k];
        if (c == b) continue;
        const int64_t d = rows[i] - rows[k];
        const int64_t peak = std::max(load[b] - d, load[c] + d);
        if (peak < best_peak) best_peak = peak, bi = i, bk = k;
      }
    }
    if (bi < 0) break;
    std::swap(rank_of[bi], rank_of[bk]);
  }
  load = loads();
  const int64_t after = *std::max_element(load.begin(), load.end());
  if (after >= m.busiest_before || static_cast<double>(after) > (1.0 - min_gain) * static_cast<double>(m.busiest_before))
    return m;  // no gain, or too small a one
  for (int e = 0; e < E; ++e) m.src[static_cast<size_t>(rank_of[e] * El + e % El)] = e;
  m.busiest_after = after;
  m.moved = 0;
  for (int g = 0; g < E; ++g) m.moved += m.src[g] != g;
  return m;
}

}  // namespace

ExpertMoves balance_experts(const std::vector<int64_t>& rows, int ep_size, double min_gain, bool same_slot) {
  check_shape(rows, ep_size);
  const int E = static_cast<int>(rows.size()), P = ep_size, El = E / P;
  ExpertMoves m;
  m.src.resize(static_cast<size_t>(E));
  std::iota(m.src.begin(), m.src.end(), 0);
  m.busiest_before = m.busiest_after = busiest_rank_rows(rows, P);
  if (P == 1) return m;
  if (same_slot) return balance_same_slot(rows, P, min_gain, std::move(m));

  // Largest first onto the least loaded group with room (ties: the expert's own rank, then the lowest group).
  std::vector<int> order(static_cast<size_t>(E));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return rows[a] > rows[b]; });
  std::vector<int> group(static_cast<size_t>(E), -1), size(static_cast<size_t>(P), 0);
  std::vector<int64_t> load(static_cast<size_t>(P), 0);
  for (int e : order) {
    int best = -1;
    for (int g = 0; g < P; ++g) {
      if (size[g] == El) continue;
      if (best < 0 || load[g] < load[best] || (load[g] == load[best] && g == e / El)) best = g;
    }
    group[e] = best;
    ++size[best];
    load[best] += rows[e];
  }
  // Swaps between the busiest group and another while the pair's larger load falls below the busiest's.
  for (int iter = 0; iter < 4 * E * E; ++iter) {
    load = group_rows(rows, group, P);
    const int b = static_cast<int>(std::max_element(load.begin(), load.end()) - load.begin());
    int64_t best_peak = load[b];
    int bi = -1, bj = -1;
    for (int i = 0; i < E; ++i) {
      if (group[i] != b) continue;
      for (int j = 0; j < E; ++j) {
        if (group[j] == b) continue;
        const int64_t d = rows[i] - rows[j];
        const int64_t peak = std::max(load[b] - d, load[group[j]] + d);
        if (peak < best_peak) best_peak = peak, bi = i, bj = j;
      }
    }
    if (bi < 0) break;
    std::swap(group[bi], group[bj]);
  }
  load = group_rows(rows, group, P);
  const int64_t after = *std::max_element(load.begin(), load.end());
  if (after >= m.busiest_before || static_cast<double>(after) > (1.0 - min_gain) * static_cast<double>(m.busiest_before))
    return m;  // no gain, or too small a one

  // Groups to ranks: greedily the (group, rank) pair sharing the most experts, so that few experts move.
  std::vector<int> rank_of(static_cast<size_t>(P), -1);
  std::vector<bool> rank_used(static_cast<size_t>(P), false);
  for (int k = 0; k < P; ++k) {
    int bg = -1, br = -1, bn = -1;
    for (int g = 0; g < P; ++g) {
      if (rank_of[g] >= 0) continue;
      for (int r = 0; r < P; ++r) {
        if (rank_used[r]) continue;
        int n = 0;
        for (int e = r * El; e < (r + 1) * El; ++e) n += group[e] == g;
        if (n > bn) bn = n, bg = g, br = r;
      }
    }
    rank_of[bg] = br;
    rank_used[br] = true;
  }
  // Slots: an expert staying on its rank keeps its slot; those arriving fill the freed slots in order.
  std::vector<int> src(static_cast<size_t>(E), -1);
  for (int e = 0; e < E; ++e)
    if (rank_of[group[e]] == e / El) src[e] = e;
  for (int e = 0; e < E; ++e) {
    const int r = rank_of[group[e]];
    if (r == e / El) continue;
    int g = r * El;
    while (src[g] >= 0) ++g;
    src[g] = e;
  }
  m.src = src;
  m.busiest_after = after;
  for (int g = 0; g < E; ++g) m.moved += src[g] != g;
  return m;
}

}  // namespace mxt
