#include "mxtrain/backend.hpp"

#include "mxtrain/config.hpp"
#include "mxtrain/device_info.hpp"
#ifdef MXTRAIN_HAVE_CUDA
#include "cuda_ops.hpp"
#include "fp32/cuda_f32_ops.hpp"
#endif

namespace mxt {

std::unique_ptr<Ops> make_backend(const std::string& backend, std::string& why, int device) {
  const int gpus = cuda_device_count();
#ifdef MXTRAIN_HAVE_CUDA
  if (backend == "cuda" || backend == "cuda-fp32" || (backend == "auto" && gpus > 0)) {
    if (gpus == 0) throw ConfigError("backend=cuda: no CUDA device is visible (" + cuda_device_summary() + ")");
    if (device < 0 || device >= gpus)
      throw ConfigError("backend=" + backend + ": this rank needs GPU " + std::to_string(device) + " (one GPU per " +
                        "local rank) but " + std::to_string(gpus) + " are visible; run at most " +
                        std::to_string(gpus) + " ranks per node");
    if (!cuda_binary_runs_on(device))
      throw ConfigError("backend=" + backend + ": this mxtrain has no kernels for GPU " + std::to_string(device) +
                        " of " + cuda_device_summary() + ": it was built for CUDA architectures " +
                        cuda_built_archs() + ". Rebuild on this machine (scripts/build.sh adds the Blackwell GPUs " +
                        "nvidia-smi reports) or configure with -DCMAKE_CUDA_ARCHITECTURES naming this GPU's");
    why = "backend=" + backend + ": CUDA device " + std::to_string(device) + " of " + cuda_device_summary();
    if (const int cc = cuda_compute_capability(device); cc != 0 && cc != 90)
      why += "; not a Hopper GPU, so the generic CUDA kernels run instead of the sm_90a ones (correct, slower)" +
             std::string(cc >= 100 ? "; the MXFP8 dense linears use cuBLASLt's block-scaled GEMM (untested path)" : "");
    if (backend == "cuda-fp32") {
      why += "; fp32 activations and plain fp32 kernels (a numerics check, not the fast bf16 path)";
      return make_cuda_f32_ops(device);
    }
    return make_cuda_ops(device);
  }
#else
  if (backend == "cuda" || backend == "cuda-fp32")
    throw ConfigError("backend=" + backend + ": this mxtrain was built without CUDA (MXTRAIN_CUDA=OFF); use backend=cpu");
  if (backend == "auto" && gpus > 0) {
    why = "backend=auto: GPUs present but this build has no CUDA backend; using the CPU reference backend";
    return make_cpu_ops();
  }
#endif
  why = backend == "cpu" ? "backend=cpu: CPU reference backend (fp32)"
                         : "backend=auto: no CUDA device; using the CPU reference backend (fp32)";
  return make_cpu_ops();
}

DType backend_act_dtype(const std::string& backend) {
  if (backend == "cuda") return DType::BF16;  // CudaOps::act_dtype
  if (backend == "cuda-fp32") return DType::F32;  // CudaF32Ops::act_dtype
#ifdef MXTRAIN_HAVE_CUDA
  if (backend == "auto" && cuda_device_count() > 0) return DType::BF16;
#endif
  return DType::F32;  // CpuOps::act_dtype
}

}  // namespace mxt
