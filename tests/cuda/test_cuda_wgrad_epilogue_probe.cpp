// The weight-gradient epilogue probe (bench_wgrad_epilogue's kernel) against its CPU twin: every element of dW
// after two launches on random starting values, for every way of writing the tile.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.hpp"
#include "wgrad_epilogue_probe.hpp"

namespace mxt::testing {
namespace {

using sm90::ProbeConfig;
using sm90::ProbeWrite;

constexpr int E = 2, M = 384, N = 768;  // 3 x 3 tiles per expert: 18 tiles over 4 CTAs wrap each box ring

// dW after two launches from `start`, as the probe defines it.
std::vector<float> twin(const std::vector<float>& start, ProbeWrite w) {
  std::vector<float> out = start;
  for (int e = 0; e < E; ++e)
    for (int r = 0; r < M; ++r)
      for (int n = 0; n < N; ++n) {
        float& o = out[(static_cast<size_t>(e) * M + r) * N + n];
        const float v = sm90::probe_value(e, r, n);
        if (w == ProbeWrite::kTmaAdd || w == ProbeWrite::kTmaAddWarp || w == ProbeWrite::kRedV2 ||
            w == ProbeWrite::kRedV4)
          o = (o + v) + v;
        else if (w == ProbeWrite::kTmaStore || w == ProbeWrite::kStV2)
          o = v;
      }
  return out;
}

void expect_probe_matches(const ProbeConfig& cfg, const std::string& what) {
  SCOPED_TRACE(what);
  std::vector<float> start(static_cast<size_t>(E) * M * N);
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> u(-4.f, 4.f);
  for (float& v : start) v = static_cast<float>(static_cast<int>(u(rng) * 64)) / 64.f;  // exact sums
  float* dW = nullptr;
  ASSERT_EQ(cudaMalloc(&dW, start.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dW, start.data(), start.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  sm90::ProbeCycles cyc;
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(sm90::wgrad_epilogue_probe(cfg, dW, E, M, N, &cyc, nullptr));
  // Both warpgroups of every tile report one epilogue; each took some cycles.
  EXPECT_EQ(cyc.epilogues, 2u * E * (M / 128) * (N / 256));
  EXPECT_GT(cyc.epi_cycles, 0u);
  std::vector<float> got(start.size());
  ASSERT_EQ(cudaMemcpy(got.data(), dW, got.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(dW);
  const std::vector<float> want = twin(start, cfg.write);
  int bad = 0;
  for (size_t i = 0; i < got.size() && bad < 5; ++i)
    if (got[i] != want[i]) {
      ADD_FAILURE() << "element " << i << ": " << got[i] << " want " << want[i];
      ++bad;
    }
}

TEST(CudaWgradEpilogueProbe, EveryWriteMatchesItsCpuTwin) {
  MXT_REQUIRE_SM90();
  ProbeConfig cfg;
  cfg.ctas = 4;
  cfg.delay = 2000;
  for (const ProbeWrite w :
       {ProbeWrite::kTmaAdd, ProbeWrite::kTmaStore, ProbeWrite::kSmemOnly, ProbeWrite::kTmaAddWarp})
    for (const int cols : {16, 32})
      for (const int bufs : {1, 2, 3, 6, 12}) {
        cfg.write = w;
        cfg.box_cols = cols;
        cfg.bufs = bufs;
        expect_probe_matches(cfg, "tma write " + std::to_string(static_cast<int>(w)) + ", 64x" +
                                      std::to_string(cols) + " x" + std::to_string(bufs));
      }
  for (const ProbeWrite w : {ProbeWrite::kRedV2, ProbeWrite::kStV2, ProbeWrite::kRedV4}) {
    cfg.write = w;
    expect_probe_matches(cfg, "direct write " + std::to_string(static_cast<int>(w)));
  }
  cfg.write = ProbeWrite::kTmaAdd;
  cfg.box_cols = 16;
  cfg.bufs = 3;
  cfg.stagger = true;
  cfg.prefetch = false;
  expect_probe_matches(cfg, "staggered, no prefetch");
  // Beside the load stream (paced and unpaced): the same sums, and every launch ends.
  void* src = nullptr;
  ASSERT_EQ(cudaMalloc(&src, 256 * 4096 * 2), cudaSuccess);
  cfg.stagger = false;
  cfg.load_src = src;
  cfg.load_rows = 256;
  for (const int64_t kb : {500, 0}) {
    cfg.load_kb_cycles = kb;
    for (const int cols : {16, 32}) {
      cfg.box_cols = cols;
      expect_probe_matches(cfg, "with the load stream, 64x" + std::to_string(cols) + ", pace " + std::to_string(kb));
    }
  }
  cudaFree(src);
}

TEST(CudaWgradEpilogueProbe, RefusesWhatItCannotRun) {
  MXT_REQUIRE_SM90();
  ProbeConfig cfg;
  float* dW = nullptr;
  ASSERT_EQ(cudaMalloc(&dW, static_cast<size_t>(E) * M * N * 4), cudaSuccess);
  cfg.bufs = 5;
  EXPECT_FALSE(sm90::wgrad_epilogue_probe(cfg, dW, E, M, N, nullptr, nullptr));
  cfg.bufs = 3;
  cfg.box_cols = 8;
  EXPECT_FALSE(sm90::wgrad_epilogue_probe(cfg, dW, E, M, N, nullptr, nullptr));
  cfg.box_cols = 16;
  EXPECT_FALSE(sm90::wgrad_epilogue_probe(cfg, dW, E, M + 64, N, nullptr, nullptr));
  cfg.load_kb_cycles = 0;  // a load stream without a source
  EXPECT_FALSE(sm90::wgrad_epilogue_probe(cfg, dW, E, M, N, nullptr, nullptr));
  cfg.load_kb_cycles = -1;
  EXPECT_TRUE(sm90::wgrad_epilogue_probe(cfg, dW, E, M, N, nullptr, nullptr));
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaFree(dW);
}

}  // namespace
}  // namespace mxt::testing
