#pragma once
// Host-side pieces both Hopper TMA + wgmma kernels need: whether a device can run an sm_90a kernel image, the
// driver's tensor-map encoder, and pointer alignment checks.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "cuda_common.cuh"

namespace mxt::sm90 {

// Compute capability 9.0 and an sm_90a image of `kernel` (any kernel of the file), per device, checked once:
// `cache` is the caller's (one per kernel file), 0 unknown, 1 yes, 2 no.
inline bool device_runs_sm90a(int device, const void* kernel, std::atomic<int> (&cache)[64]) {
  if (device < 0 || device >= 64) return false;
  int c = cache[device].load();
  if (c == 0) {
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    cudaFuncAttributes attr{};
    const bool image = cudaFuncGetAttributes(&attr, kernel) == cudaSuccess && attr.binaryVersion == 90;
    cudaGetLastError();  // clear a failed query
    c = (major == 9 && minor == 0 && image) ? 1 : 2;
    cache[device].store(c);
  }
  return c == 1;
}

// cuTensorMapEncodeTiled (the CUDA 12 ABI) from the driver, fetched once; `op` names the (first) caller in the
// error.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder(const char* op) {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [op] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    const cudaError_t err =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q);
    if (err != cudaSuccess || q != cudaDriverEntryPointSuccess || f == nullptr)
      cuda::fail(op, std::string("cannot get cuTensorMapEncodeTiled from the driver: ") + cudaGetErrorString(err));
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// A measuring probe's launch checks: a current device (its SM count into sms) with an sm_90a image of `kernel`,
// and a grid of `ctas` CTAs (0: one per SM) that fits it. nullptr when the probe can run, else why not.
inline const char* probe_launch_check(const void* kernel, std::atomic<int> (&cache)[64], int ctas, int& sms) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
    return "no CUDA device";
  if (!device_runs_sm90a(dev, kernel, cache)) return "needs an sm_90a device (Hopper)";
  if (ctas < 0 || ctas > sms) return "ctas must be 0 (every SM) or at most the SM count";
  return nullptr;
}

inline bool aligned(const void* p, uintptr_t bytes) { return (reinterpret_cast<uintptr_t>(p) & (bytes - 1)) == 0; }

}  // namespace mxt::sm90
