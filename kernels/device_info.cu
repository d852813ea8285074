// CUDA build of include/mxtrain/device_info.hpp (the CPU-only build uses src/core/device_info_stub.cpp).
#include "mxtrain/device_info.hpp"

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

namespace mxt {

int cuda_device_count() noexcept {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    // cudaErrorNoDevice / cudaErrorInsufficientDriver / ...: not sticky, but clear the last-error slot so a
    // later launch check does not report it.
    (void)cudaGetLastError();
    return 0;
  }
  return n < 0 ? 0 : n;
}

std::string cuda_device_summary() {
  const int n = cuda_device_count();
  if (n == 0) return "no CUDA device";
  std::string out;
  for (int d = 0; d < n; ++d) {
    if (!out.empty()) out += "; ";
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, d) != cudaSuccess) {
      (void)cudaGetLastError();
      out += "device " + std::to_string(d) + " (properties unavailable)";
      continue;
    }
    const uint64_t gib = static_cast<uint64_t>(p.totalGlobalMem) >> 30;
    char buf[320];
    std::snprintf(buf, sizeof buf, "%s (sm_%d%d, %d SMs, %llu GiB)", p.name, p.major, p.minor,
                  p.multiProcessorCount, static_cast<unsigned long long>(gib));
    out += buf;
  }
  return out;
}

const char* cuda_built_archs() noexcept { return MXTRAIN_CUDA_ARCHS; }

namespace {
__global__ void image_probe_kernel() {}
}  // namespace

// Leaves `device` current: setting another device back would create a context there (CUDA 12+), and every
// caller goes on to use this one.
bool cuda_binary_runs_on(int device) noexcept {
  if (cudaSetDevice(device) != cudaSuccess) {
    (void)cudaGetLastError();
    return true;  // cannot tell: the caller's own errors will name the device
  }
  cudaFuncAttributes attr{};
  const cudaError_t err = cudaFuncGetAttributes(&attr, image_probe_kernel);
  (void)cudaGetLastError();
  return err != cudaErrorInvalidDeviceFunction && err != cudaErrorNoKernelImageForDevice;
}

int cuda_compute_capability(int device) noexcept {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return major * 10 + minor;
}

}  // namespace mxt
