// The expert weight gradient's fp32 epilogue alone (one GPU, issue 4): wgrad_epilogue_probe writes every
// 128 x 256 tile of the 8x7B W13 dW [8, 28,672, 4,096] from two warpgroups' registers as the grouped GEMM's
// epilogue does, with a spin of --delay SM cycles per tile standing in for the mainloop (about 35,000 in the
// grouped GEMM at this shape: 7.64 M cycles over 217 tiles per SM, session 41's Nsight Compute profile), and
// without one (every SM in its epilogue at once). Each row is one way of writing the tile: the TMA adding or
// storing from boxes of 16 or 32 fp32 columns with 1-12 boxes in flight per warpgroup, or adding from per-warp
// 16-row boxes; red.global / st.global
// straight from the registers; the boxes filled but never sent (what the epilogue costs inside the SM).
// Reference in the same run: cudaMemsetAsync of the same bytes (the device's write rate).
//
// Per row: the launch's median time, the cycles one warpgroup spends in one tile's epilogue (mean), the SM's
// epilogue rate (two warpgroups' 128 KiB over those cycles) and the launch's rate over dW's bytes. Every row is
// checked first: one launch on a zeroed dW, then rows of every expert against probe_value (exit 1 on a mismatch).
//
// Then the same beside a stand-in for the mainloop's operand traffic: a ninth warp streaming 48 KiB TMA k-blocks from
// an L2-resident buffer at the mainloop's pace (--load-kb cycles per k-block) and unpaced.
//
// Usage: bench_wgrad_epilogue [--runs N] [--delay CYCLES] [--ctas N] [--load-kb CYCLES]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "wgrad_epilogue_probe.hpp"

namespace {

using mxt::bench::ck;
using mxt::sm90::ProbeConfig;
using mxt::sm90::ProbeWrite;

constexpr int E = 8, M = 2 * 14336, N = 4096;  // W13's dW: [E, 2f, h]

struct Variant {
  const char* name;
  ProbeWrite write;
  int cols, bufs;
};

// Rows of dW checked after one launch on zeros: three per expert.
int check(float* dW, const ProbeConfig& cfg, double& max_err) {
  std::vector<float> row(N);
  int bad = 0;
  for (int e = 0; e < E; ++e) {
    for (const int r : {(e * 613) % M, (e * 2477 + 1000) % M, M - 1 - e}) {
      ck(cudaMemcpy(row.data(), dW + (static_cast<int64_t>(e) * M + r) * N, N * 4, cudaMemcpyDeviceToHost), "copy");
      for (int n = 0; n < N; ++n) {
        const float want = cfg.write == ProbeWrite::kSmemOnly ? 0.f : mxt::sm90::probe_value(e, r, n);
        const double err = std::fabs(static_cast<double>(row[n]) - want);
        max_err = std::max(max_err, err);
        bad += err != 0.0;
      }
    }
  }
  return bad;
}

int run(int argc, char** argv) {
  int runs = 5, ctas = 0;
  long long delay = 35000, load_kb = 1100;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--runs" && i + 1 < argc) {
      runs = std::atoi(argv[++i]);
    } else if (a == "--delay" && i + 1 < argc) {
      delay = std::atoll(argv[++i]);
    } else if (a == "--ctas" && i + 1 < argc) {
      ctas = std::atoi(argv[++i]);
    } else if (a == "--load-kb" && i + 1 < argc) {
      load_kb = std::atoll(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--runs N] [--delay CYCLES] [--ctas N] [--load-kb CYCLES]\n", argv[0]);
      return 2;
    }
  }
  if (runs < 1 || delay < 0 || ctas < 0 || load_kb < 1) {
    std::fprintf(stderr, "bench_wgrad_epilogue: --runs and --load-kb must be >= 1, --delay and --ctas >= 0\n");
    return 2;
  }
  int dev = 0, sms = 0;
  ck(cudaGetDevice(&dev), "device");
  ck(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "SM count");
  const size_t bytes = static_cast<size_t>(E) * M * N * 4;
  float* dW = nullptr;
  ck(cudaMalloc(&dW, bytes), "dW");
  cudaStream_t st;
  ck(cudaStreamCreate(&st), "stream");
  cudaEvent_t e0, e1;
  ck(cudaEventCreate(&e0), "event");
  ck(cudaEventCreate(&e1), "event");

  const std::vector<Variant> variants = {
      {"tma add 64x16 x3 (main)", ProbeWrite::kTmaAdd, 16, 3},
      {"tma add 64x16 x2", ProbeWrite::kTmaAdd, 16, 2},
      {"tma add 64x16 x6", ProbeWrite::kTmaAdd, 16, 6},
      {"tma add 64x16 x12", ProbeWrite::kTmaAdd, 16, 12},
      {"tma add 64x16 x1", ProbeWrite::kTmaAdd, 16, 1},
      {"tma add 64x32 x1", ProbeWrite::kTmaAdd, 32, 1},
      {"tma add 64x32 x2", ProbeWrite::kTmaAdd, 32, 2},
      {"tma add 64x32 x3", ProbeWrite::kTmaAdd, 32, 3},
      {"tma add 64x32 x6", ProbeWrite::kTmaAdd, 32, 6},
      {"tma add per warp 16x16 x3", ProbeWrite::kTmaAddWarp, 16, 3},
      {"tma add per warp 16x16 x6", ProbeWrite::kTmaAddWarp, 16, 6},
      {"tma add per warp 16x32 x3", ProbeWrite::kTmaAddWarp, 32, 3},
      {"tma add per warp 16x32 x6", ProbeWrite::kTmaAddWarp, 32, 6},
      {"tma store 64x16 x3", ProbeWrite::kTmaStore, 16, 3},
      {"tma store 64x32 x3", ProbeWrite::kTmaStore, 32, 3},
      {"boxes only 64x16 x3", ProbeWrite::kSmemOnly, 16, 3},
      {"boxes only 64x32 x3", ProbeWrite::kSmemOnly, 32, 3},
      {"red.global v2", ProbeWrite::kRedV2, 16, 2},
      {"st.global v2", ProbeWrite::kStV2, 16, 2},
      {"red.global v4", ProbeWrite::kRedV4, 16, 2},
  };
  struct Setting {
    std::string label;
    long long delay;
    bool stagger, prefetch;
    int ctas;
    long long load_kb = -1;  // the load stream's cycles per k-block (ProbeConfig::load_kb_cycles)
  };
  std::vector<Setting> settings = {{"no spin", 0, false, true, ctas}, {"spin", delay, false, true, ctas}};
  // The operands the load stream reads: 32 MiB of bf16, L2-resident as most of the grouped GEMM's operand reads are.
  constexpr int64_t kLoadRows = 4096;
  void* load_src = nullptr;
  ck(cudaMalloc(&load_src, kLoadRows * 4096 * 2), "load source");
  ck(cudaMemset(load_src, 0x3c, kLoadRows * 4096 * 2), "load source");

  std::printf("bench_wgrad_epilogue: dW [%d, %d, %d] fp32 (%.2f GB), %d SMs, spin %lld cycles per tile\n", E, M, N,
              bytes / 1e9, sms, delay);
  std::printf("| setting | write | ms | cycles / tile epilogue | SM B/cycle in epilogue | GB/s over dW | check |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- |\n");
  int failures = 0;
  auto row = [&](const Setting& s, const Variant& v) {
    ProbeConfig cfg;
    cfg.write = v.write;
    cfg.box_cols = v.cols;
    cfg.bufs = v.bufs;
    cfg.ctas = s.ctas;
    cfg.delay = s.delay;
    cfg.stagger = s.stagger;
    cfg.prefetch = s.prefetch;
    cfg.load_kb_cycles = s.load_kb;
    cfg.load_src = load_src;
    cfg.load_rows = kLoadRows;
    ck(cudaMemset(dW, 0, bytes), "zero");
    mxt::sm90::ProbeCycles cyc;
    if (!mxt::sm90::wgrad_epilogue_probe(cfg, dW, E, M, N, &cyc, st)) {
      std::printf("| %s | %s | - | - | - | - | FAILED to run |\n", s.label.c_str(), v.name);
      ++failures;
      return;
    }
    double max_err = 0;
    const int bad = check(dW, cfg, max_err);
    failures += bad != 0;
    std::vector<double> ms;
    double cycles = 0, epis = 0;
    for (int i = 0; i < runs; ++i) {
      ck(cudaEventRecord(e0, st), "event");
      if (!mxt::sm90::wgrad_epilogue_probe(cfg, dW, E, M, N, &cyc, st)) throw std::runtime_error("probe failed");
      ck(cudaEventRecord(e1, st), "event");
      ck(cudaEventSynchronize(e1), "sync");
      float m = 0;
      ck(cudaEventElapsedTime(&m, e0, e1), "elapsed");
      ms.push_back(m);
      cycles += static_cast<double>(cyc.epi_cycles);
      epis += static_cast<double>(cyc.epilogues);
    }
    std::sort(ms.begin(), ms.end());
    const double med = ms[ms.size() / 2], per = cycles / std::max(epis, 1.0);
    char chk[64] = "ok";
    if (bad) std::snprintf(chk, sizeof(chk), "MISMATCH: %d values, max err %.3g", bad, max_err);
    std::printf("| %s | %s | %.3f | %.0f | %.1f | %.0f | %s |\n", s.label.c_str(), v.name, med, per,
                2.0 * 64 * 256 * 4 / per, bytes / (med * 1e-3) / 1e9, chk);
    std::fflush(stdout);
  };
  for (const auto& s : settings)
    for (const auto& v : variants) row(s, v);
  // The default epilogue under the other grid settings: no L2 prefetch, staggered CTAs, half the SMs.
  const Variant& main_v = variants[0];
  row({"spin, no prefetch", delay, false, false, ctas}, main_v);
  row({"spin, staggered", delay, true, true, ctas}, main_v);
  row({"spin, half the SMs", delay, false, true, sms / 2}, main_v);
  row({"no spin, half the SMs", 0, false, true, sms / 2}, main_v);
  // With the mainloop's operand traffic beside the spin: 48 KiB per --load-kb cycles per SM (the 128 x 256 item's
  // k-block: 1,100 cycles in the grouped GEMM at this shape, 7.64 M cycles over 6,944 k-blocks per SM), and as
  // fast as the stream's 2-stage ring allows.
  for (const long long kb : {load_kb, 0LL}) {
    const std::string label = kb ? "spin + loads every " + std::to_string(kb) + " cycles" : "spin + loads unpaced";
    for (const Variant& v : variants) {
      if (v.write != ProbeWrite::kRedV4 && v.bufs <= 3 && v.cols * v.bufs <= 96)
        row({label, delay, false, true, ctas, kb}, v);
    }
  }

  // The device's write rate over the same bytes.
  std::vector<double> ms;
  for (int i = 0; i < runs; ++i) {
    ck(cudaEventRecord(e0, st), "event");
    ck(cudaMemsetAsync(dW, i & 0xFF, bytes, st), "memset");
    ck(cudaEventRecord(e1, st), "event");
    ck(cudaEventSynchronize(e1), "sync");
    float m = 0;
    ck(cudaEventElapsedTime(&m, e0, e1), "elapsed");
    ms.push_back(m);
  }
  std::sort(ms.begin(), ms.end());
  std::printf("| reference | cudaMemsetAsync of dW | %.3f | - | - | %.0f | - |\n", ms[ms.size() / 2],
              bytes / (ms[ms.size() / 2] * 1e-3) / 1e9);
  cudaFree(dW);
  cudaFree(load_src);
  if (failures) std::fprintf(stderr, "bench_wgrad_epilogue: %d rows failed their check\n", failures);
  return failures ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) { return mxt::bench::guarded_main("bench_wgrad_epilogue", run, argc, argv); }
