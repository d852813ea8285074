// The wgmma rate probe (bench_wgmma_rate's kernel) against its CPU twin: for every issue pattern, CTA 0's
// accumulators after a few k-blocks equal kblocks x (a's block) x b^T, element for element. Small integer operands
// keep every sum exact, so any misplaced row, column, k step or chain shows.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.hpp"
#include "wgmma_rate_probe.hpp"

namespace mxt::testing {
namespace {

constexpr int kRows = 256, kK = 64, kBlocks = 3;

TEST(CudaWgmmaRateProbe, EveryPatternMatchesItsCpuTwin) {
  MXT_REQUIRE_SM90();
  std::mt19937 rng(4321);
  std::uniform_int_distribution<int> u(-3, 3);
  std::vector<int> a(kRows * kK), b(kRows * kK);
  std::vector<uint16_t> ha(a.size()), hb(b.size());
  for (size_t i = 0; i < a.size(); ++i) a[i] = u(rng), ha[i] = f32_to_bf16_bits(static_cast<float>(a[i]));
  for (size_t i = 0; i < b.size(); ++i) b[i] = u(rng), hb[i] = f32_to_bf16_bits(static_cast<float>(b[i]));  // small integers: exact
  uint16_t *da = nullptr, *db = nullptr;
  float* dout = nullptr;
  ASSERT_EQ(cudaMalloc(&da, ha.size() * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&db, hb.size() * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dout, 2 * 4 * 64 * 256 * 4), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(da, ha.data(), ha.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(db, hb.data(), hb.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_GE(sm90::rate_pattern_count(), 8);
  for (int pi = 0; pi < sm90::rate_pattern_count(); ++pi) {
    const sm90::RatePattern& p = sm90::rate_pattern(pi);
    SCOPED_TRACE(p.name);
    const size_t n_out = static_cast<size_t>(p.warpgroups) * p.chains * 64 * p.n;
    ASSERT_EQ(cudaMemset(dout, 0xFF, n_out * 4), cudaSuccess);  // NaN: an unwritten element fails
    sm90::RateConfig cfg;
    cfg.pattern = pi;
    cfg.kblocks = kBlocks;
    cfg.ctas = 2;
    sm90::RateResult res;
    ASSERT_TRUE(sm90::wgmma_rate_probe(cfg, da, db, dout, &res, nullptr));
    EXPECT_GT(res.cycles_per_kblock, 0.0);
    std::vector<float> got(n_out);
    ASSERT_EQ(cudaMemcpy(got.data(), dout, n_out * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    const std::vector<float> want = sm90::rate_probe_twin(p, a, b, kBlocks);
    int bad = 0;
    for (size_t i = 0; i < n_out && bad < 5; ++i)
      if (got[i] != want[i]) {  // index: ((warpgroup * chains + chain) * 64 + row) * n + column
        ADD_FAILURE() << "element " << i << ": " << got[i] << " want " << want[i];
        ++bad;
      }
  }
  cudaFree(da);
  cudaFree(db);
  cudaFree(dout);
}

TEST(CudaWgmmaRateProbe, RefusesWhatItCannotRun) {
  MXT_REQUIRE_SM90();
  uint16_t* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, kRows * kK * 2), cudaSuccess);
  sm90::RateConfig cfg;
  cfg.pattern = sm90::rate_pattern_count();
  EXPECT_FALSE(sm90::wgmma_rate_probe(cfg, d, d, nullptr, nullptr, nullptr));
  cfg.pattern = 0;
  cfg.kblocks = 0;
  EXPECT_FALSE(sm90::wgmma_rate_probe(cfg, d, d, nullptr, nullptr, nullptr));
  cfg.kblocks = 1;
  EXPECT_FALSE(sm90::wgmma_rate_probe(cfg, nullptr, d, nullptr, nullptr, nullptr));
  cfg.ctas = 100000;
  EXPECT_FALSE(sm90::wgmma_rate_probe(cfg, d, d, nullptr, nullptr, nullptr));
  cfg.ctas = 1;
  EXPECT_TRUE(sm90::wgmma_rate_probe(cfg, d, d, nullptr, nullptr, nullptr));
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaFree(d);
}

}  // namespace
}  // namespace mxt::testing
