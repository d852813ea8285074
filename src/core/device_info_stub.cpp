// CPU-only build of include/mxtrain/device_info.hpp. In the CUDA build (MXTRAIN_HAVE_CUDA defined) this file
// compiles to nothing and kernels/device_info.cu provides the functions.
#ifndef MXTRAIN_HAVE_CUDA

#include "mxtrain/device_info.hpp"

namespace mxt {

int cuda_device_count() noexcept { return 0; }

std::string cuda_device_summary() { return "no CUDA device"; }
const char* cuda_built_archs() noexcept { return "none"; }
bool cuda_binary_runs_on(int) noexcept { return false; }
int cuda_compute_capability(int) noexcept { return 0; }

}  // namespace mxt

#endif  // MXTRAIN_HAVE_CUDA
