#include <stdexcept>

#include "mxtrain/params.hpp"

namespace mxt {

ParamLayout ParamLayout::build(const ModelConfig& m, int64_t first_expert, int64_t num_local_experts) {
  ParamLayout L;
  L.first_expert = first_expert;
  L.num_local_experts = num_local_experts;
  const int64_t d = m.hidden_size, f = m.intermediate_size, hd = m.head_dim();
  auto add = [&](const std::string& name, std::vector<int64_t> shape, bool expert, bool norm = false) {
    ParamInfo p;
    p.name = name;
    p.shape = std::move(shape);
    p.expert = expert;
    p.is_norm = norm;
    p.numel = 1;
    for (auto s : p.shape) p.numel *= s;
    int64_t& cursor = expert ? L.expert_numel : L.dense_numel;
    p.offset = cursor;
    cursor += p.numel;
    L.params.push_back(std::move(p));
  };
  add("model.embed_tokens.weight", {m.vocab_size, d}, false);
  for (int64_t l = 0; l < m.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {d}, false, true);
    add(p + "self_attn.q_proj.weight", {m.num_attention_heads * hd, d}, false);
    add(p + "self_attn.k_proj.weight", {m.num_key_value_heads * hd, d}, false);
    add(p + "self_attn.v_proj.weight", {m.num_key_value_heads * hd, d}, false);
    add(p + "self_attn.o_proj.weight", {d, m.num_attention_heads * hd}, false);
    add(p + "post_attention_layernorm.weight", {d}, false, true);
    add(p + "block_sparse_moe.gate.weight", {m.num_local_experts, d}, false);
    // Gate (w1) and up (w3) stacked so one grouped GEMM computes both.
    add(p + "block_sparse_moe.experts.w13", {num_local_experts, 2 * f, d}, true);
    add(p + "block_sparse_moe.experts.w2", {num_local_experts, d, f}, true);
  }
  add("model.norm.weight", {d}, false, true);
  add("lm_head.weight", {m.vocab_size, d}, false);
  return L;
}

const ParamInfo& ParamLayout::find(const std::string& name) const {
  for (const auto& p : params)
    if (p.name == name) return p;
  throw std::out_of_range("no parameter named '" + name + "'");
}

ModelTensors bind_tensors(const ParamLayout& layout, const ModelConfig& m, const Tensor& dense_flat,
                          const Tensor& expert_flat) {
  auto at = [&](const std::string& name) {
    const ParamInfo& p = layout.find(name);
    const Tensor& flat = p.expert ? expert_flat : dense_flat;
    char* base = static_cast<char*>(flat.data) + p.offset * dtype_size(flat.dtype);
    Tensor t(base, flat.dtype, {p.numel}, flat.device);
    t.ndim = static_cast<int>(p.shape.size());
    for (int i = 0; i < t.ndim; ++i) t.shape[i] = p.shape[i];
    return t;
  };
  ModelTensors w;
  w.embed = at("model.embed_tokens.weight");
  w.norm = at("model.norm.weight");
  w.lm_head = at("lm_head.weight");
  for (int64_t l = 0; l < m.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    LayerTensors t;
    t.ln1 = at(p + "input_layernorm.weight");
    t.wq = at(p + "self_attn.q_proj.weight");
    t.wk = at(p + "self_attn.k_proj.weight");
    t.wv = at(p + "self_attn.v_proj.weight");
    t.wo = at(p + "self_attn.o_proj.weight");
    t.ln2 = at(p + "post_attention_layernorm.weight");
    t.gate = at(p + "block_sparse_moe.gate.weight");
    t.w13 = at(p + "block_sparse_moe.experts.w13");
    t.w2 = at(p + "block_sparse_moe.experts.w2");
    w.layers.push_back(t);
  }
  return w;
}

}  // namespace mxt
