// MXTRAIN_STAGE_TIMING's CUDA clock: with "ops", every marked launch is timed under its innermost stage.
#include <gtest/gtest.h>

#include <cstdlib>
#include <sstream>
#include <string>

#include <cuda_runtime.h>

#include "cuda_context.cuh"
#include "cuda_ops.hpp"
#include "cuda_test_util.hpp"
#include "mxtrain/trace.hpp"

namespace mxt::testing {
namespace {

// The clock a CudaOps installs under MXTRAIN_STAGE_TIMING=value, with its log of `steps` add / mul pairs.
std::string timed_log(const char* value, int steps) {
  EXPECT_EQ(stage_clock(), nullptr);
  setenv("MXTRAIN_STAGE_TIMING", value, 1);
  auto gpu = make_cuda_ops();
  unsetenv("MXTRAIN_STAGE_TIMING");
  StageClock* clock = stage_clock();
  if (clock == nullptr) {
    ADD_FAILURE() << "no stage clock installed";
    return {};
  }
  const int64_t n = 1 << 20;
  auto a = upload(*gpu, randn(n, 7), DType::BF16, {n});
  auto b = upload(*gpu, randn(n, 8), DType::BF16, {n});
  DeviceTensor out(*gpu, DType::BF16, {n});
  for (int i = 0; i < steps; ++i) {
    TraceScope stage("layer " + std::to_string(i) + " attn: norm");
    gpu->add(a, b, out);
    gpu->mul(a, out, out);
  }
  ::testing::internal::CaptureStdout();
  clock->log("test", steps);
  return ::testing::internal::GetCapturedStdout();
}

// The row of `name` in the log, or "".
std::string row_of(const std::string& log, const std::string& name) {
  std::istringstream in(log);
  for (std::string line; std::getline(in, line);)
    if (line.find(name) != std::string::npos) return line;
  return {};
}

TEST(CudaStageClock, OpsModeTimesEachLaunchUnderItsStage) {
  MXT_REQUIRE_GPU();
  const std::string log = timed_log("ops", 3);
  EXPECT_NE(row_of(log, "attn: norm ").find("x3"), std::string::npos) << log;  // the stage row
  // The first launch only starts the clock: add is timed twice, mul three times.
  const std::string add = row_of(log, "attn: norm > add"), mul = row_of(log, "attn: norm > mul");
  ASSERT_FALSE(add.empty()) << log;
  ASSERT_FALSE(mul.empty()) << log;
  EXPECT_EQ(add.substr(add.size() - 2), "x2") << add;
  EXPECT_EQ(mul.substr(mul.size() - 2), "x3") << mul;
  // 4 MiB in, 2 MiB out per launch: at least a microsecond each on any GPU
  EXPECT_EQ(mul.find(" 0.0 us each"), std::string::npos) << mul;
}

// Work on the side stream (fork / join) is timed as "stream join" when the compute stream waits for it, not
// charged to the next launch: a 512 MiB memset on the side, and the add after the join stays as fast as before it.
TEST(CudaStageClock, SideStreamWaitIsItsOwnRow) {
  MXT_REQUIRE_GPU();
  setenv("MXTRAIN_STAGE_TIMING", "ops", 1);
  auto gpu = make_cuda_ops();
  unsetenv("MXTRAIN_STAGE_TIMING");
  StageClock* clock = stage_clock();
  ASSERT_NE(clock, nullptr);
  CudaContext& ctx = static_cast<CudaOps&>(*gpu).ctx();
  const int64_t n = 1 << 20;
  auto a = upload(*gpu, randn(n, 9), DType::BF16, {n});
  DeviceTensor out(*gpu, DType::BF16, {n});
  const size_t big = size_t{512} << 20;
  void* side_buf = nullptr;
  ASSERT_EQ(cudaMalloc(&side_buf, big), cudaSuccess);
  for (int i = 0; i < 3; ++i) {
    TraceScope stage("layer " + std::to_string(i) + " attn bwd: core");
    gpu->mul(a, a, out);
    cudaStream_t side = ctx.fork();
    ASSERT_EQ(cudaMemsetAsync(side_buf, i, big, side), cudaSuccess);
    ctx.join();
    gpu->add(a, a, out);
  }
  ::testing::internal::CaptureStdout();
  clock->log("test", 3);
  const std::string log = ::testing::internal::GetCapturedStdout();
  cudaFree(side_buf);
  const std::string join = row_of(log, "attn bwd: core > stream join"), add = row_of(log, "attn bwd: core > add");
  ASSERT_FALSE(join.empty()) << log;
  ASSERT_FALSE(add.empty()) << log;
  EXPECT_EQ(join.substr(join.size() - 2), "x3") << join;
  // per-launch microseconds: the join row holds the memset (>= 50 us at any HBM rate), the add does not
  auto us_each = [](const std::string& row) { return std::stod(row.substr(row.find("ms/step") + 7)); };
  EXPECT_GT(us_each(join), 50.0) << log;
  EXPECT_LT(us_each(add), 0.5 * us_each(join)) << log;
}

TEST(CudaStageClock, StageModeHasNoOpTable) {
  MXT_REQUIRE_GPU();
  const std::string log = timed_log("1", 2);
  EXPECT_NE(row_of(log, "attn: norm").find("x2"), std::string::npos) << log;
  EXPECT_EQ(log.find("op times"), std::string::npos) << log;
}

}  // namespace
}  // namespace mxt::testing
