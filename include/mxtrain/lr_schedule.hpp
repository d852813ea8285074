#pragma once
#include "mxtrain/config.hpp"

namespace mxt {

// The recipe's schedule at optimizer step `step` (0-based): linear warm-up from 0 to lr over
// num_warmup_steps, cosine from lr to lr*min_lr_ratio over num_decay_steps, then constant.
double lr_at_step(const AdamWConfig& opt, const LRSchedulerConfig& s, int64_t step);

}  // namespace mxt
