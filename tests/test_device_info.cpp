// mxt::cuda_device_count / cuda_device_summary on whatever machine the tests run on.
// Set MXTRAIN_EXPECT_GPU=1 (as a run on the GPU machine should) to make "no GPU visible" a failure, not a skip.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <sys/stat.h>

#include "mxtrain/device_info.hpp"

namespace {

bool path_exists(const char* p) {
  struct stat st;
  return ::stat(p, &st) == 0;
}

// No NVIDIA device nodes: no driver loaded, so no CUDA device can be visible.
bool machine_has_no_nvidia_driver() { return !path_exists("/dev/nvidiactl") && !path_exists("/dev/nvidia0"); }

bool gpu_expected() {
  const char* v = std::getenv("MXTRAIN_EXPECT_GPU");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

}  // namespace

TEST(DeviceInfo, CountIsStableAndMatchesSummary) {
  const int n = mxt::cuda_device_count();
  EXPECT_GE(n, 0);
  EXPECT_EQ(mxt::cuda_device_count(), n) << "a second call must give the same count";
  const std::string s = mxt::cuda_device_summary();
  if (n == 0) {
    EXPECT_EQ(s, "no CUDA device");
  } else {
    EXPECT_EQ(s.find("no CUDA device"), std::string::npos) << s;
    EXPECT_NE(s.find("sm_"), std::string::npos) << s;
    EXPECT_NE(s.find(" SMs, "), std::string::npos) << s;
    EXPECT_NE(s.find(" GiB)"), std::string::npos) << s;
  }
}

TEST(DeviceInfo, NoDriverMeansNoDevice) {
#ifndef MXTRAIN_HAVE_CUDA
  EXPECT_EQ(mxt::cuda_device_count(), 0) << "the CPU-only build never reports a CUDA device";
#endif
  if (!machine_has_no_nvidia_driver()) GTEST_SKIP() << "NVIDIA device nodes present: not a no-GPU machine";
  EXPECT_EQ(mxt::cuda_device_count(), 0);
  EXPECT_EQ(mxt::cuda_device_summary(), "no CUDA device");
}

TEST(DeviceInfo, GpuVisible) {
  const int n = mxt::cuda_device_count();
  if (n == 0) {
    if (gpu_expected()) FAIL() << "MXTRAIN_EXPECT_GPU=1 but no CUDA device is visible";
#ifdef MXTRAIN_HAVE_CUDA
    GTEST_SKIP() << "no CUDA device visible on this machine";
#else
    GTEST_SKIP() << "CPU-only build (MXTRAIN_CUDA=OFF): no CUDA device can be visible";
#endif
  }
  EXPECT_GT(n, 0);
  const std::string s = mxt::cuda_device_summary();
  EXPECT_NE(s.find("sm_"), std::string::npos) << s;
  std::printf("CUDA devices: %d: %s\n", n, s.c_str());
}

TEST(DeviceInfo, BuiltArchitecturesAreNamed) {
  const std::string archs = mxt::cuda_built_archs();
#ifdef MXTRAIN_HAVE_CUDA
  EXPECT_NE(archs.find("90a"), std::string::npos) << archs << ": every CUDA build includes Hopper";
#else
  EXPECT_EQ(archs, "none");
  EXPECT_FALSE(mxt::cuda_binary_runs_on(0));
#endif
}

// On the GPU machine: this binary runs on every visible GPU (the check behind backend=cuda's start-up error for a
// GPU the build has no kernels for), and each reports its compute capability.
TEST(DeviceInfo, BinaryRunsOnTheVisibleGpus) {
  const int n = mxt::cuda_device_count();
  if (n == 0) {
    if (gpu_expected()) FAIL() << "MXTRAIN_EXPECT_GPU=1 but no CUDA device is visible";
    GTEST_SKIP() << "no CUDA device visible";
  }
  for (int d = 0; d < n; ++d) {
    EXPECT_TRUE(mxt::cuda_binary_runs_on(d)) << "device " << d << " of " << mxt::cuda_device_summary();
    EXPECT_GE(mxt::cuda_compute_capability(d), 90) << "device " << d;
  }
}
