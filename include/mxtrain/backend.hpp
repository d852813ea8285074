#pragma once
#include <memory>
#include <string>

#include "mxtrain/ops.hpp"

namespace mxt {

// The Ops for config key `backend` (auto | cpu | cuda | cuda-fp32). `why` says what was chosen and why. device: the GPU a
// CUDA backend uses (one per local rank under MPI); it must be visible.
std::unique_ptr<Ops> make_backend(const std::string& backend, std::string& why, int device = 0);

// The activation dtype of the backend make_backend would choose here (cpu, cuda-fp32: F32; cuda: BF16), without creating
// it: --dry-run plans a backend=cuda run on a machine with no GPU (or a build without CUDA).
DType backend_act_dtype(const std::string& backend);

}  // namespace mxt
