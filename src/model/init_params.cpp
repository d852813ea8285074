#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "mxtrain/cpus.hpp"
#include "mxtrain/params.hpp"
#include "mxtrain/rng.hpp"

namespace mxt {

void init_params_host(const ParamLayout& layout, const ModelConfig& m, uint64_t seed,
                      std::vector<float>& dense, std::vector<float>& expert) {
  dense.assign(layout.dense_numel, 0.f);
  expert.assign(layout.expert_numel, 0.f);
  const double stdv = m.initializer_range;
  // Tensors draw from independent streams, so they can be filled in parallel (billions of values for 8x7B).
  auto fill_one = [&](const ParamInfo& p) {
    float* dst = (p.expert ? expert.data() : dense.data()) + p.offset;
    if (p.is_norm) {
      for (int64_t i = 0; i < p.numel; ++i) dst[i] = 1.f;
      return;
    }
    if (!p.expert) {
      Rng rng(hash_string(p.name, seed));
      for (int64_t i = 0; i < p.numel; ++i) dst[i] = static_cast<float>(stdv * rng.normal());
      return;
    }
    // One stream per global expert index, so EP layouts agree on every expert's weights.
    const int64_t per_expert = p.numel / layout.num_local_experts;
    for (int64_t e = 0; e < layout.num_local_experts; ++e) {
      Rng rng(hash_string(p.name + "#" + std::to_string(layout.first_expert + e), seed));
      for (int64_t i = 0; i < per_expert; ++i)
        dst[e * per_expert + i] = static_cast<float>(stdv * rng.normal());
    }
  };
  std::atomic<size_t> next{0};
  auto fill = [&] {
    for (size_t i; (i = next.fetch_add(1)) < layout.params.size();) fill_one(layout.params[i]);
  };
  const int n = std::min(16, usable_cpus());
  std::vector<std::thread> pool;
  for (int t = 0; t < n; ++t) pool.emplace_back(fill);
  for (auto& t : pool) t.join();
}

}  // namespace mxt
