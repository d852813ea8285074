// MXTRAIN_STAGE_TIMING's CUDA clock: with "ops", every marked launch is timed under its innermost stage.
#include <gtest/gtest.h>

#include <cstdlib>
#include <sstream>
#include <string>

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

TEST(CudaStageClock, StageModeHasNoOpTable) {
  MXT_REQUIRE_GPU();
  const std::string log = timed_log("1", 2);
  EXPECT_NE(row_of(log, "attn: norm").find("x2"), std::string::npos) << log;
  EXPECT_EQ(log.find("op times"), std::string::npos) << log;
}

}  // namespace
}  // namespace mxt::testing
