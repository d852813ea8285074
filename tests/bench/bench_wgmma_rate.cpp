// The tensor pipe's rate per issue pattern (one GPU, issue 4): wgmma_rate_probe runs wgmma chains over operands
// resident in shared memory on every SM, nothing else, so each row says how fast an SM retires wgmmas when issued
// that way. Reference in the same run: the grouped GEMM's own pattern (two warpgroups, one m64n256 chain each;
// first row) and the tensor pipe's dense bf16 peak, 4,096 FLOP per cycle per SM (H100 / H200: 989 TFLOP/s at
// 1,830 MHz over 132 SMs).
//
// The question behind it: a ping-pong schedule hides one warpgroup's epilogue behind the other's mainloop, so
// for a while one warpgroup alone must keep the pipe full. Session 40's ping-pong wgrad (one m64n256 chain per
// warpgroup) ran its mainloop at 0.59 of dense, and the cooperative 128 x 128 tile at the same; this says whether
// that is the pipe's rate for the pattern, and which pattern a lone warpgroup would need.
//
// Every pattern's sums are checked first on 2 CTAs against the CPU (exit 1 on a mismatch); the test
// CudaWgmmaRateProbe does the same element by element. Patterns run round robin, --rounds times; per row the
// median over rounds.
//
// Usage: bench_wgmma_rate [--rounds N] [--kblocks N]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "wgmma_rate_probe.hpp"

namespace {

using mxt::bench::ck;

constexpr int kRows = 256, kK = 64;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 5, kblocks = 20000;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--rounds") rounds = std::atoi(argv[i + 1]);
    else if (k == "--kblocks") kblocks = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "bench_wgmma_rate: unknown option %s (usage: [--rounds N] [--kblocks N])\n", k.c_str());
      return 2;
    }
  }
  if (rounds < 1 || kblocks < 1) {
    std::fprintf(stderr, "bench_wgmma_rate: --rounds and --kblocks must be positive\n");
    return 2;
  }
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess) {
    std::fprintf(stderr, "bench_wgmma_rate: no CUDA device\n");
    return 1;
  }
  // Small integers: the check below is exact.
  std::vector<int> a(kRows * kK), b(kRows * kK);
  std::vector<uint16_t> ha(a.size()), hb(b.size());
  uint64_t s = 99;
  auto next = [&] {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<int>((s >> 33) % 7) - 3;
  };
  for (size_t i = 0; i < a.size(); ++i) a[i] = next(), ha[i] = mxt::bench::bf16_bits(static_cast<float>(a[i]));
  for (size_t i = 0; i < b.size(); ++i) b[i] = next(), hb[i] = mxt::bench::bf16_bits(static_cast<float>(b[i]));
  uint16_t *da = nullptr, *db = nullptr;
  float* dout = nullptr;
  ck(cudaMalloc(&da, ha.size() * 2), "cudaMalloc");
  ck(cudaMalloc(&db, hb.size() * 2), "cudaMalloc");
  ck(cudaMalloc(&dout, 2 * 4 * 64 * 256 * 4), "cudaMalloc");
  ck(cudaMemcpy(da, ha.data(), ha.size() * 2, cudaMemcpyHostToDevice), "upload");
  ck(cudaMemcpy(db, hb.data(), hb.size() * 2, cudaMemcpyHostToDevice), "upload");

  const int np = mxt::sm90::rate_pattern_count();
  for (int pi = 0; pi < np; ++pi) {
    const auto& p = mxt::sm90::rate_pattern(pi);
    mxt::sm90::RateConfig cfg;
    cfg.pattern = pi;
    cfg.kblocks = 5;
    cfg.ctas = 2;
    ck(cudaMemset(dout, 0xFF, 2 * 4 * 64 * 256 * 4), "cudaMemset");  // NaN: an unwritten element fails
    if (!mxt::sm90::wgmma_rate_probe(cfg, da, db, dout, nullptr, nullptr)) return 1;
    std::vector<float> got(static_cast<size_t>(p.warpgroups) * p.chains * 64 * p.n);
    ck(cudaMemcpy(got.data(), dout, got.size() * 4, cudaMemcpyDeviceToHost), "download");
    const std::vector<float> want = mxt::sm90::rate_probe_twin(p, a, b, cfg.kblocks);
    for (size_t i = 0; i < got.size(); ++i)
      if (got[i] != want[i]) {
        std::fprintf(stderr, "bench_wgmma_rate: %s: element %zu = %g, want %g\n", p.name, i, got[i], want[i]);
        return 1;
      }
  }
  std::printf("bench_wgmma_rate: %d SMs, %d k-blocks (4 k16 steps per chain) per warpgroup, %d rounds; every "
              "pattern's sums checked against the CPU first\n",
              sms, kblocks, rounds);

  std::vector<std::vector<double>> cyc(np), fpc(np), tfs(np);
  for (int r = 0; r < rounds; ++r)
    for (int pi = 0; pi < np; ++pi) {
      mxt::sm90::RateConfig cfg;
      cfg.pattern = pi;
      cfg.kblocks = kblocks;
      mxt::sm90::RateResult res;
      if (!mxt::sm90::wgmma_rate_probe(cfg, da, db, nullptr, &res, nullptr)) return 1;
      cyc[pi].push_back(res.cycles_per_kblock);
      fpc[pi].push_back(res.flop_per_cycle);
      tfs[pi].push_back(res.tflops);
    }
  const double ref = median(fpc[0]);
  std::printf("| pattern | cycles per k-block (per warpgroup) | FLOP / cycle / SM | of peak (4,096) | of the first row | "
              "TFLOP/s (wall) |\n| --- | --- | --- | --- | --- | --- |\n");
  for (int pi = 0; pi < np; ++pi) {
    const double f = median(fpc[pi]);
    std::printf("| %s | %.0f | %.0f | %.3f | %.3f | %.1f |\n", mxt::sm90::rate_pattern(pi).name, median(cyc[pi]), f,
                f / 4096.0, f / ref, median(tfs[pi]));
  }
  cudaFree(da);
  cudaFree(db);
  cudaFree(dout);
  return 0;
}
