#include "mxtrain/backend.hpp"

#include "mxtrain/config.hpp"
#include "mxtrain/device_info.hpp"

namespace mxt {

std::unique_ptr<Ops> make_backend(const std::string& backend, std::string& why) {
  const int gpus = cuda_device_count();
  if (backend == "cuda")
    throw ConfigError("backend=cuda: the CUDA backend is not implemented yet (devices seen: " +
                      cuda_device_summary() + "); use backend=cpu or backend=auto");
  if (backend == "auto" && gpus > 0)
    why = "backend=auto: " + std::to_string(gpus) +
          " GPU(s) present but the CUDA backend is not implemented yet; using the CPU reference backend";
  else if (backend == "auto")
    why = "backend=auto: no CUDA device; using the CPU reference backend";
  else
    why = "backend=cpu: CPU reference backend (fp32)";
  return make_cpu_ops();
}

}  // namespace mxt
