#pragma once
// Memory plans of the shipped configs as --dry-run backend=cuda makes them (bf16 activations, no GPU needed).
#include <yaml-cpp/yaml.h>

#include <cstddef>
#include <string>
#include <vector>

#include "mxtrain/config.hpp"
#include "mxtrain/trainer.hpp"

namespace mxt::testing {

// Whole plan per rank in bytes: fp32 state and working copies, MXFP8 weight copies, activations, LM-head scratch.
inline size_t gpu_plan_bytes(const std::string& config_name, const std::vector<std::string>& overrides) {
  const MemoryPlan p = plan_memory(to_train_config(resolve_config(LoadOptions{config_name, "", overrides})),
                                   DType::BF16);
  return p.total_bytes();
}

}  // namespace mxt::testing
