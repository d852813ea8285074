#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "mxtrain/cpus.hpp"
#include "mxtrain/params.hpp"
#include "mxtrain/rng.hpp"

namespace mxt {

namespace {

// Values per random stream. A tensor (or one expert's slice) longer than this draws its later chunks from streams
// of their own, so the set-up's threads share the largest tensors instead of waiting on one thread each (the
// 8x7B-shape bench spent 53 s of its minute on a 525 M-value embedding). Chunk 0 keeps the tensor's original
// stream: every tensor up to this size has the values it always had.
constexpr int64_t kStreamChunk = int64_t{1} << 24;

struct Draw {
  float* dst;
  int64_t n;
  uint64_t seed;
};

}  // namespace

uint64_t init_chunk_seed(uint64_t stream_seed, int64_t chunk) {
  if (chunk == 0) return stream_seed;
  uint64_t s = stream_seed ^ (static_cast<uint64_t>(chunk) * 0xD1B54A32D192ED03ull);
  return splitmix64(s);
}

void init_params_host(const ParamLayout& layout, const ModelConfig& m, uint64_t seed,
                      std::vector<float>& dense, std::vector<float>& expert) {
  dense.resize(layout.dense_numel);
  expert.resize(layout.expert_numel);
  init_params_host(layout, m, seed, dense.data(), expert.data());
}

void init_params_host(const ParamLayout& layout, const ModelConfig& m, uint64_t seed, float* dense, float* expert) {
  const double stdv = m.initializer_range;
  std::vector<Draw> draws;
  auto add_stream = [&](float* dst, int64_t n, uint64_t stream_seed) {
    for (int64_t c = 0; c * kStreamChunk < n; ++c)
      draws.push_back({dst + c * kStreamChunk, std::min(kStreamChunk, n - c * kStreamChunk),
                       init_chunk_seed(stream_seed, c)});
  };
  for (const ParamInfo& p : layout.params) {
    float* dst = (p.expert ? expert : dense) + p.offset;
    if (p.is_norm) {
      std::fill(dst, dst + p.numel, 1.f);
    } else if (!p.expert) {
      add_stream(dst, p.numel, hash_string(p.name, seed));
    } else {
      // One stream per global expert index, so EP layouts agree on every expert's weights.
      const int64_t per_expert = p.numel / layout.num_local_experts;
      for (int64_t e = 0; e < layout.num_local_experts; ++e)
        add_stream(dst + e * per_expert, per_expert,
                   hash_string(p.name + "#" + std::to_string(layout.first_expert + e), seed));
    }
  }
  std::atomic<size_t> next{0};
  auto fill = [&] {
    for (size_t i; (i = next.fetch_add(1)) < draws.size();) {
      Rng rng(draws[i].seed);
      for (int64_t j = 0; j < draws[i].n; ++j) draws[i].dst[j] = static_cast<float>(stdv * rng.normal());
    }
  };
  const int n = std::min<int>(64, std::max(1, usable_cpus()));
  std::vector<std::thread> pool;
  for (int t = 0; t < n; ++t) pool.emplace_back(fill);
  for (auto& t : pool) t.join();
}

}  // namespace mxt
