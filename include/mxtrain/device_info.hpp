#pragma once
// What CUDA devices this process sees. Safe to call on any machine: without a driver, a GPU or a CUDA build
// the count is 0 and the summary says "no CUDA device". Never throws.
//   CUDA build:     kernels/device_info.cu (cudaGetDeviceCount / cudaGetDeviceProperties).
//   CPU-only build: src/core/device_info_stub.cpp (always 0).
#include <string>

namespace mxt {

// Number of visible CUDA devices; any CUDA error (no driver, no device, driver too old) counts as 0.
int cuda_device_count() noexcept;

// One entry per device, "; "-separated: "NVIDIA H200 (sm_90, 132 SMs, 139 GiB)"; "no CUDA device" when the
// count is 0. GiB are rounded down.
std::string cuda_device_summary();

}  // namespace mxt
