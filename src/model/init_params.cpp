#include "mxtrain/params.hpp"
#include "mxtrain/rng.hpp"

namespace mxt {

void init_params_host(const ParamLayout& layout, const ModelConfig& m, uint64_t seed,
                      std::vector<float>& dense, std::vector<float>& expert) {
  dense.assign(layout.dense_numel, 0.f);
  expert.assign(layout.expert_numel, 0.f);
  const double stdv = m.initializer_range;
  for (const ParamInfo& p : layout.params) {
    float* dst = (p.expert ? expert.data() : dense.data()) + p.offset;
    if (p.is_norm) {
      for (int64_t i = 0; i < p.numel; ++i) dst[i] = 1.f;
      continue;
    }
    if (!p.expert) {
      Rng rng(hash_string(p.name, seed));
      for (int64_t i = 0; i < p.numel; ++i) dst[i] = static_cast<float>(stdv * rng.normal());
      continue;
    }
    // One stream per global expert index, so EP layouts agree on every expert's weights.
    const int64_t per_expert = p.numel / layout.num_local_experts;
    for (int64_t e = 0; e < layout.num_local_experts; ++e) {
      Rng rng(hash_string(p.name + "#" + std::to_string(layout.first_expert + e), seed));
      for (int64_t i = 0; i < per_expert; ++i)
        dst[e * per_expert + i] = static_cast<float>(stdv * rng.normal());
    }
  }
}

}  // namespace mxt
