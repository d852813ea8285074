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

// The CUDA architectures this binary was built for ("90a;100a"); "none" in the CPU-only build.
const char* cuda_built_archs() noexcept;
// False only when the CUDA runtime says this binary holds no kernel image that device `device` can run (built
// for other architectures); true otherwise, including when it cannot tell. Makes `device` the current device.
// The CPU-only build: false.
bool cuda_binary_runs_on(int device) noexcept;
// major * 10 + minor of device `device` (90 for Hopper), 0 when unknown.
int cuda_compute_capability(int device) noexcept;

}  // namespace mxt
