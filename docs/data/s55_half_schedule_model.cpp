// Session 55: what half units could save in the 8x7B trainer's forward / dgrad calls, given the persistent kernel's
// static schedule (CTA pair c takes items c, c + 66, ...; the last round split along K). A model, not a
// measurement: a full unit costs its k-blocks, a half unit h times them, a split part its share of the k-blocks;
// a call takes as long as its busiest CTA pair. Uses the kernel's own schedule functions (kernels/sm90_row_units.hpp).
//   g++ -std=c++17 -O2 -I kernels -I /usr/local/cuda/include docs/data/s55_half_schedule_model.cpp -o /tmp/hsm
//   /tmp/hsm
#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <random>
#include <vector>

#include "sm90_row_units.hpp"

using namespace mxt::sm90;

// The busiest pair's k-blocks for units of these costs in item order, nk k-blocks each: the last round split as
// tail_split does, each item to pair item % pairs (the kernel's static schedule) or, dynamic, to the pair that is
// free first (an atomic work counter).
double busiest(const std::vector<double>& costs, int nk, int pairs, bool dynamic) {
  const TailSplit ts = tail_split(static_cast<int>(costs.size()), pairs, nk, 8);
  std::vector<double> busy(pairs, 0.0);
  for (int item = 0; item < ts.items; ++item) {
    const int unit = item < ts.full ? item : ts.full + (item - ts.full) / ts.parts;
    int kb0 = 0, kb1 = nk;
    if (item >= ts.full) tail_part_range(nk, (item - ts.full) % ts.parts, ts.parts, kb0, kb1);
    const int pair =
        dynamic ? static_cast<int>(std::min_element(busy.begin(), busy.end()) - busy.begin()) : item % pairs;
    busy[pair] += costs[unit] * (kb1 - kb0);
  }
  return *std::max_element(busy.begin(), busy.end());
}

// The busiest pair's k-blocks for one call: experts' rows `loads`, n_tiles of 256 columns, nk k-blocks per unit.
// dynamic: as in busiest.
// tails_last: the units of at most 64 rows moved after all others (item order otherwise kept).
double call_time(const std::vector<int>& loads, int n_tiles, int nk, double h, int pairs, bool dynamic,
                 bool tails_last = false) {
  std::vector<double> costs, tails;
  for (int r : loads) {
    const int mt = (r + 127) / 128;
    for (int local = 0; local < row_units_of_expert(mt, n_tiles, 2, true); ++local) {
      // Both ranks of a pair run the same item in step: the pair costs its slower rank.
      double cost = 0;
      for (int rank = 0; rank < 2; ++rank) {
        const RowUnit u = row_unit(local, mt, n_tiles, 2, true, rank);
        const int rows = std::min(128, r - u.m_tile * 128);
        cost = std::max(cost, rows <= 64 ? h : 1.0);
      }
      (tails_last && cost < 1.0 ? tails : costs).push_back(cost);
    }
  }
  costs.insert(costs.end(), tails.begin(), tails.end());
  return busiest(costs, nk, pairs, dynamic);
}

// The merged-tails variant of call_time (static schedule): unit costs in item order, experts' odd-tail units of
// <= 64 rows paired in expert order (an odd one out stays alone), the pair's first unit dropped and its second
// costing m.
double merged_time(const std::vector<int>& loads, int n_tiles, int nk, double m, int pairs) {
  std::vector<double> cost;
  int pending = -1;  // an expert whose tails wait for a partner
  std::vector<int> partner(loads.size(), -1);
  for (size_t e = 0; e < loads.size(); ++e) {
    const int mt = (loads[e] + 127) / 128;
    if (pairs_odd_tail(mt, n_tiles, 2, true) && loads[e] - (mt - 1) * 128 <= 64) {
      if (pending < 0) {
        pending = static_cast<int>(e);
      } else {
        partner[pending] = static_cast<int>(e);  // pending's tails are dropped, e's cost m
        partner[e] = pending;
        pending = -1;
      }
    }
  }
  for (size_t e = 0; e < loads.size(); ++e) {
    const int mt = (loads[e] + 127) / 128;
    const int n = row_units_of_expert(mt, n_tiles, 2, true);
    for (int local = 0; local < n; ++local) {
      const RowUnit u = row_unit(local, mt, n_tiles, 2, true, 0);
      const bool tail = !u.shared_b;
      if (tail && partner[e] >= 0 && partner[e] > static_cast<int>(e)) continue;  // merged into the partner's
      cost.push_back(tail && partner[e] >= 0 ? m : 1.0);
    }
  }
  return busiest(cost, nk, pairs, false);
}

// One micro-batch's 8,192 routed rows over 8 experts, uniformly at random (1,024 +- 30 rows per expert).
std::vector<int> uniform_loads(std::mt19937& rng) {
  std::vector<int> loads(8, 0);
  std::uniform_int_distribution<int> pick(0, 7);
  for (int r = 0; r < 8192; ++r) ++loads[pick(rng)];
  return loads;
}

int main() {
  struct Call {
    const char* name;
    int n_tiles, nk;
  };
  // 8x7B: hidden 4096, intermediate 14336; one micro-batch's 8,192 routed rows.
  const Call calls[] = {{"fwd W13", 112, 64}, {"fwd W2", 16, 224}, {"dgrad W2", 56, 64}, {"dgrad W13", 16, 448}};
  const int pairs = 66;  // 132 SMs
  const double hs[5] = {1.0, 0.85, 0.75, 0.65, 0.5};
  for (int dynamic = 0; dynamic < 2; ++dynamic) {
    std::printf("\n%s schedule: the busiest pair's k-blocks relative to the static schedule without half units\n",
                dynamic ? "dynamic (free pair first)" : "static (item % pairs, the kernel's)");
    std::printf("| loads | call | h = 1 (off) | 0.85 | 0.75 | 0.65 | 0.5 |\n");
    std::printf("| --- | --- | --- | --- | --- | --- | --- |\n");
    std::mt19937 rng(55);
    double sum[5] = {0, 0, 0, 0, 0}, base = 0;
    for (int draw = 0; draw < 20; ++draw) {
      const std::vector<int> loads = uniform_loads(rng);
      for (const Call& c : calls) {
        const double t0 = call_time(loads, c.n_tiles, c.nk, 1.0, pairs, false);
        double t[5];
        for (int i = 0; i < 5; ++i) {
          t[i] = call_time(loads, c.n_tiles, c.nk, hs[i], pairs, dynamic);
          sum[i] += t[i];
        }
        base += t0;
        if (draw < 2)
          std::printf("| draw %d | %s | %.4f | %.4f | %.4f | %.4f | %.4f |\n", draw, c.name, t[0] / t0, t[1] / t0,
                      t[2] / t0, t[3] / t0, t[4] / t0);
      }
    }
    std::printf("all four calls, 20 draws of uniform routing:");
    for (int i = 0; i < 5; ++i) std::printf("  h %.2f: %.4f", hs[i], sum[i] / base);
    std::printf("\n");
  }
  // Each variant against the kernel's schedule without half units, over the same 20 draws.
  auto versus = [&](const char* what, const std::function<double(const std::vector<int>&, const Call&)>& variant) {
    std::mt19937 rng(55);
    double base = 0, other = 0;
    for (int draw = 0; draw < 20; ++draw) {
      const std::vector<int> loads = uniform_loads(rng);
      for (const Call& c : calls) {
        base += call_time(loads, c.n_tiles, c.nk, 1.0, pairs, false);
        other += variant(loads, c);
      }
    }
    std::printf("%s: %.4f\n", what, other / base);
  };
  // Tails last (MXTRAIN_GG_HALF_TAIL=last): the half units after every full unit, so that they spread over the pairs.
  for (double h : {1.0, 0.85, 0.65, 0.5})
    versus(("half units at " + std::to_string(h).substr(0, 4) + " moved last, static schedule").c_str(),
           [&](const std::vector<int>& loads, const Call& c) {
             return call_time(loads, c.n_tiles, c.nk, h, pairs, false, true);
           });
  // Merged tails (not built): the odd-tail units of two experts whose last m-tile holds at most 64 rows run as one
  // unit (each warpgroup on one expert's rows with that expert's weight tile) costing m units, so the call has one
  // unit fewer per such pair of experts and n-tile pair. Static schedule, h = 1 for the rest.
  for (double m : {1.0, 1.25, 1.5, 2.0})
    versus(("merged tails costing " + std::to_string(m).substr(0, 4) + " units, static schedule").c_str(),
           [&](const std::vector<int>& loads, const Call& c) { return merged_time(loads, c.n_tiles, c.nk, m, pairs); });
  // Session 45's forced balance (every expert exactly 1,024 rows) against random routing, static schedule, h = 1:
  // measured there, the forward and dgrad took 9.6 ms (6.6%) less per step.
  versus("forced balance (every expert 1,024 rows), static schedule", [&](const std::vector<int>&, const Call& c) {
    return call_time(std::vector<int>(8, 1024), c.n_tiles, c.nk, 1.0, pairs, false);
  });
  return 0;
}
