#pragma once
#include <memory>
#include <string>

#include "mxtrain/ops.hpp"

namespace mxt {

// The Ops for config key `backend` (auto | cpu | cuda). `why` says what was chosen and why. device: the GPU a
// CUDA backend uses (one per local rank under MPI); it must be visible.
std::unique_ptr<Ops> make_backend(const std::string& backend, std::string& why, int device = 0);

}  // namespace mxt
