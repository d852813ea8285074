#pragma once
// The expert weight gradient over several row sets (grouped_gemm_wgrad_sets on Hopper, expert_wgrad_micro_batches):
// its kernel contracts each set's rows of an expert in 64-row k-blocks, so every (set, expert) ends in a partial
// k-block that loads and waits like a whole one. Gathered, each set keeps its whole k-blocks in place and its last
// rows of each expert (fewer than 64) move into one extra row set, grouped by expert and in set order within: one
// partial k-block per expert instead of one per set and expert. Pure C++ (the memory plan and host tests use it;
// MXT_HOST_DEVICE marks what device code calls as well).
#include <cstdint>

#include "mxtrain/host_device.hpp"

namespace mxt {

inline constexpr int kWgradTailBlock = 64;  // the kernel's k-block (rows)

// How many of an expert's rows [lo, hi) of one set leave for the tail set: those past its last whole k-block.
MXT_HOST_DEVICE inline int32_t wgrad_tail_rows(int32_t lo, int32_t hi) { return hi > lo ? (hi - lo) % kWgradTailBlock : 0; }

// The tail set's layout from the counts r[s * E + e] of `sets` sets: its expert offsets off[E + 1], and dst[s * E + e],
// the tail row that (set s, expert e)'s first leaving row goes to.
MXT_HOST_DEVICE inline void wgrad_tail_layout(const int32_t* r, int sets, int E, int32_t* off, int32_t* dst) {
  off[0] = 0;
  for (int e = 0; e < E; ++e) {
    int32_t row = off[e];
    for (int s = 0; s < sets; ++s) {
      dst[s * E + e] = row;
      row += r[s * E + e];
    }
    off[e + 1] = row;
  }
}

// Rows the tail set can need for `sets` sets of E experts (each (set, expert) leaves at most 63).
inline int64_t wgrad_tail_capacity(int64_t sets, int64_t E) { return sets * E * (kWgradTailBlock - 1); }

// Ints the tail set's offsets [E + 1] take in its buffer (rounded up to 256 bytes).
inline int64_t wgrad_tail_offset_ints(int64_t E) { return (E + 64) / 64 * 64; }

// Device bytes of the tail set for dy and x of cols = out + in bf16 columns, with its offsets and copy plan
// (the memory plan counts this where the trainer contracts several micro-batches per weight-gradient call).
inline int64_t wgrad_tail_bytes(int64_t sets, int64_t E, int64_t cols) {
  return wgrad_tail_capacity(sets, E) * cols * 2 + wgrad_tail_offset_ints(E) * 4 + sets * E * 3 * 4;
}

}  // namespace mxt
