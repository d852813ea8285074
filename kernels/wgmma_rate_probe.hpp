#pragma once
// A measuring kernel for the tensor pipe alone (issue 4): wgmma chains over operands that stay in shared memory,
// no loads and no epilogue, so that how fast an SM retires wgmmas for a given issue pattern (warpgroups issuing,
// independent accumulator chains per warpgroup, N per instruction, K-major or M/N-major operands) is measured
// without the grouped GEMM's pipeline around it. The question it answers: can one warpgroup keep the tensor pipe
// full while the other runs an epilogue (a ping-pong schedule), and with what chains.
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

namespace mxt::sm90 {

struct RatePattern {
  const char* name;
  int warpgroups;  // 1 or 2 issuing warpgroups
  int chains;      // independent accumulators per warpgroup (chains x n / 2 <= 128 registers)
  int n;           // 64, 128 or 256: wgmma m64nNk16
  int trans;       // 0: both operands K-major; 1: both M/N-major (the weight gradient's operands)
  int pending;     // wgmma groups (k-blocks of 4 k16 steps) left in flight at each wait: 0 or 1
};

// The patterns this probe is built for; index into it in RateConfig::pattern.
int rate_pattern_count();
const RatePattern& rate_pattern(int i);

struct RateConfig {
  int pattern = 0;
  int kblocks = 1000;  // k-blocks (4 k16 steps per chain) each warpgroup issues
  int ctas = 0;        // grid, one CTA per SM; 0: every SM
};

struct RateResult {
  double cycles_per_kblock = 0;  // mean over the issuing warpgroups of their SM cycles per k-block
  double flop_per_cycle = 0;     // per SM: the CTA's FLOPs per k-block over cycles_per_kblock
  double ms = 0;                 // wall time of the launch (events)
  double tflops = 0;             // every CTA's FLOPs over ms
};

// The CPU twin: what CTA 0 writes to out for pattern p after kblocks k-blocks, from the operands' values a and b
// ([256][64] each, row-major; small integers keep every sum exact in fp32).
inline std::vector<float> rate_probe_twin(const RatePattern& p, const std::vector<int>& a, const std::vector<int>& b,
                                          int kblocks) {
  std::vector<float> want(static_cast<size_t>(p.warpgroups) * p.chains * 64 * p.n);
  for (int w = 0; w < p.warpgroups; ++w)
    for (int c = 0; c < p.chains; ++c) {
      const int blk = (w * p.chains + c) & 3;
      for (int r = 0; r < 64; ++r)
        for (int n = 0; n < p.n; ++n) {
          long dot = 0;
          for (int k = 0; k < 64; ++k) dot += static_cast<long>(a[(blk * 64 + r) * 64 + k]) * b[n * 64 + k];
          want[((static_cast<size_t>(w) * p.chains + c) * 64 + r) * p.n + n] = static_cast<float>(dot * kblocks);
        }
    }
  return want;
}

// Operands: a [256 rows][64 k] and b [256 rows][64 k] bf16 (row-major, as uint16_t bits), the same k-block every
// time. Warpgroup w's chain c multiplies a's 64-row block (w * chains + c) % 4 with b's first n rows, so its sums
// are kblocks x that block times b^T. CTA 0 writes them to out [warpgroups][chains][64][n] fp32 (null: not).
// False (with a message on stderr) when the pattern or the device cannot run it.
bool wgmma_rate_probe(const RateConfig& cfg, const uint16_t* a, const uint16_t* b, float* out, RateResult* res,
                      cudaStream_t stream);

}  // namespace mxt::sm90
