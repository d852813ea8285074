#pragma once
#include <memory>
#include <string>

#include "mxtrain/ops.hpp"

namespace mxt {

// The Ops for config key `backend` (auto | cpu | cuda). `why` says what was chosen and why.
std::unique_ptr<Ops> make_backend(const std::string& backend, std::string& why);

}  // namespace mxt
