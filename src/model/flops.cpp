#include "mxtrain/params.hpp"

namespace mxt {

double model_flops_per_token(const ModelConfig& m, int64_t seq) {
  if (m.num_attention_heads <= 0) return 0;
  const double d = static_cast<double>(m.hidden_size), f = static_cast<double>(m.intermediate_size);
  const double L = static_cast<double>(m.num_hidden_layers), V = static_cast<double>(m.vocab_size);
  const double H = static_cast<double>(m.num_attention_heads), KV = static_cast<double>(m.num_key_value_heads);
  const double hd = static_cast<double>(m.hidden_size / m.num_attention_heads);  // as HF: d // heads
  const double attn = d * H * hd + 2 * d * KV * hd + H * hd * d;
  const double moe = static_cast<double>(m.num_experts_per_tok) * 3 * d * f + d * static_cast<double>(m.num_local_experts);
  return 6 * (L * (attn + moe) + d * V) + 6 * L * d * static_cast<double>(seq);
}

}  // namespace mxt
