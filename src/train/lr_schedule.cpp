#include "mxtrain/lr_schedule.hpp"

#include <algorithm>
#include <cmath>

namespace mxt {

double lr_at_step(const AdamWConfig& opt, const LRSchedulerConfig& s, int64_t step) {
  if (step < s.num_warmup_steps) return opt.lr * static_cast<double>(step) / static_cast<double>(s.num_warmup_steps);
  if (s.num_decay_steps <= 0) return opt.lr;
  const double progress =
      std::min(1.0, static_cast<double>(step - s.num_warmup_steps) / static_cast<double>(s.num_decay_steps));
  const double cosine = 0.5 * (1.0 + std::cos(M_PI * progress));
  return opt.lr * (s.min_lr_ratio + (1.0 - s.min_lr_ratio) * cosine);
}

}  // namespace mxt
