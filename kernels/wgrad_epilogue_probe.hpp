#pragma once
// A measuring kernel for the expert weight gradient's fp32 epilogue (issue 4): the grouped GEMM's 128 x 256 tile
// leaves two warpgroups' registers the way the real epilogue does, without the mainloop, so that what limits the
// epilogue (box shape, boxes in flight, the TMA against red.global, the grid's duty cycle) can be measured alone.
// Each tile's values are a function of their coordinates (probe_value), so the result can be checked on the host.
#include <cuda_runtime.h>

#include <cstdint>

namespace mxt::sm90 {

enum class ProbeWrite : int {
  kTmaAdd = 0,    // cp.reduce.async.bulk.tensor .add.f32 from shared boxes (the kernel's default)
  kTmaStore = 1,  // cp.async.bulk.tensor stores from shared boxes (the kernel's storing form)
  kRedV2 = 2,     // red.global.add.v2.f32 straight from the accumulator fragments
  kStV2 = 3,      // st.global.v2.f32 straight from the fragments
  kRedV4 = 4,     // red.global.add.v4.f32 after one shuffle between lane pairs (4 adjacent columns per lane)
  kSmemOnly = 5,  // the boxes written and handed over (fences, barriers) but never sent: the in-SM part alone
  kTmaAddWarp = 6,  // TMA adds from per-warp 16-row boxes: each warp fills and sends its own, no named barriers
};

struct ProbeConfig {
  ProbeWrite write = ProbeWrite::kTmaAdd;
  int box_cols = 16;    // TMA modes: fp32 columns per 64-row box (16: 64-byte swizzle; 32: 128-byte swizzle)
  int bufs = 3;         // TMA modes: boxes in flight per warpgroup (1, 2, 3, 6 or 12)
  int ctas = 0;         // grid (one CTA per SM); 0: every SM
  int64_t delay = 0;    // SM cycles each tile spins before its epilogue (a stand-in for the mainloop)
  bool stagger = false; // CTA b first spins (b % 8) / 8 of a delay, so the grid's epilogues do not line up
  bool prefetch = true; // adding modes: the tile pulled into L2 when its spin starts (the kernel's prefetch)
  // A stand-in for the mainloop's operand traffic: a ninth warp streams 48 KiB k-blocks (six 64 x 64 bf16 TMA
  // boxes) from load_src [load_rows, 4096] bf16 into a 2-stage ring for the whole launch, one k-block per
  // load_kb_cycles (0: as fast as the ring turns over; < 0: no loads). Only with boxes of at most 48 KiB in all.
  int64_t load_kb_cycles = -1;
  const void* load_src = nullptr;
  int64_t load_rows = 0;  // a multiple of 64
};

// Per launch: sum over warpgroups of the SM cycles spent in the epilogue, and the number of warpgroup epilogues.
struct ProbeCycles {
  unsigned long long epi_cycles = 0, epilogues = 0;
};

// The value tile element (e, row, col) carries (small multiples of 1/4: sums of a few launches stay exact).
__host__ __device__ inline float probe_value(int64_t e, int64_t row, int64_t col) {
  return static_cast<float>((row * 7 + col * 13 + e * 5) & 255) * 0.25f - 31.75f;
}

// Every 128 x 256 tile of dW [E, M, N] (M % 128 == 0, N % 256 == 0) gets += probe_value (adding modes) or
// = probe_value (storing modes; kSmemOnly leaves dW alone). cycles (device, zeroed by the caller) receives the
// epilogue cycles. False (with a message on stderr) when the configuration or the device cannot run it.
bool wgrad_epilogue_probe(const ProbeConfig& cfg, float* dW, int E, int M, int N, ProbeCycles* cycles,
                          cudaStream_t stream);

}  // namespace mxt::sm90
