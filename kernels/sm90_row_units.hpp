#pragma once
// The Hopper grouped GEMM's forward / dgrad work units within one expert, host and device: the kernel decodes its
// items with these, and a host test checks them (tests/cuda/test_grouped_schedule.cpp).
#include <cuda_runtime.h>

namespace mxt::sm90 {

// Forward / dgrad work units of one expert with mt m-tiles and n_tiles n-tiles, for clusters of cl CTAs (1 or 2).
// A unit of a pair is two adjacent m-tiles of one n-tile, sharing the weight tile B. With odd_tail, an expert
// with an odd number of m-tiles and an even number of n-tiles runs its last m-tile over two adjacent n-tiles
// instead, each CTA with its own B; per pair of n-tiles the units are the first n-tile's m-tile pairs, the
// second's, then that last m-tile over both (B stays in L2 between them). Otherwise an odd m-tile count leaves
// the second CTA of its last pair an m-tile past the expert's (no rows).
struct RowUnit {
  int m_tile, n_tile;  // this rank's, relative to the expert (m_tile >= mt: no rows)
  bool shared_b;       // pairs: B is the pair's shared tile
};

__host__ __device__ inline bool pairs_odd_tail(int mt, int n_tiles, int cl, bool odd_tail) {
  return cl == 2 && odd_tail && (mt & 1) && (n_tiles & 1) == 0;
}

__host__ __device__ inline int row_units_of_expert(int mt, int n_tiles, int cl, bool odd_tail) {
  return pairs_odd_tail(mt, n_tiles, cl, odd_tail) ? mt * n_tiles / 2 : (mt + cl - 1) / cl * n_tiles;
}

__host__ __device__ inline RowUnit row_unit(int local, int mt, int n_tiles, int cl, bool odd_tail, int rank) {
  if (pairs_odd_tail(mt, n_tiles, cl, odd_tail)) {
    const int full = mt / 2, per = 2 * full + 1;
    const int np = local / per, r = local % per;
    if (r < 2 * full) return {(r % full) * 2 + rank, 2 * np + r / full, true};
    return {mt - 1, 2 * np + rank, false};
  }
  const int groups = (mt + cl - 1) / cl;
  return {(local % groups) * cl + rank, local / groups, cl > 1};
}

// Forward / dgrad: the last round's units split along K. With U units over C clusters (each cluster takes items c,
// c + C, ...), the last round holds r = U mod C units (all U when U < C) and leaves C - r clusters idle for a whole
// unit's time. Each of those r units instead runs as `parts` items over consecutive k-block ranges (at most C / r,
// max_parts, and nk / 2 of them, so each part keeps 2 k-blocks or more); every part stores its fp32 partial tile and
// the last to finish adds them up in part order and runs the epilogue. Items [0, full) are whole units; item
// full + j is part j % parts of unit full + j / parts.
struct TailSplit {
  int full, parts, items;
};

__host__ __device__ inline TailSplit tail_split(int units, int clusters, int nk, int max_parts) {
  const int r = clusters > 0 ? units % clusters : 0;
  int parts = r > 0 ? clusters / r : 1;
  if (parts > max_parts) parts = max_parts;
  if (parts > nk / 2) parts = nk / 2;
  if (parts < 2) return {units, 1, units};
  return {units - r, parts, units - r + r * parts};
}

// Part `part` of `parts` of nk k-blocks: [kb0, kb1).
__host__ __device__ inline void tail_part_range(int nk, int part, int parts, int& kb0, int& kb1) {
  kb0 = static_cast<int>(static_cast<long long>(nk) * part / parts);
  kb1 = static_cast<int>(static_cast<long long>(nk) * (part + 1) / parts);
}

// Wgrad: the (slow, fast) unit of an expert's local item over nf fast x ns slow units. The fast index walks groups of
// g units (g <= 0 or >= nf: one group, the plain raster), the slow index within a group, so the CTAs in flight
// read the strips of at most g fast units, which stay in L2 while the slow index moves on (the wgrad's strips run
// over all of the expert's rows: 4 MB each at 8x7B).
struct WgradUnit {
  int fast, slow;
};

__host__ __device__ inline WgradUnit wgrad_unit(int local, int nf, int ns, int g) {
  if (g <= 0 || g > nf) g = nf;
  const int block = g * ns, gi = local / block, full = nf / g;
  const int w = gi < full ? g : nf - full * g;  // the last group holds what is left
  const int r = local - gi * block;
  return {gi * g + r % w, r / w};
}

}  // namespace mxt::sm90
