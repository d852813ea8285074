// HF MixtralForCausalLM checkpoints <-> mxtrain's flat parameter buffers.
//
// Our layout keeps per-layer fused expert tensors: w13 [E_local, 2f, d] (rows [0, f) = HF w1 / gate,
// rows [f, 2f) = HF w3 / up) and w2 [E_local, d, f]. Each expert's w1, w3 and w2 is therefore one contiguous
// block of those buffers, and so is each expert's slice of transformers-5's fused gate_up_proj [E, 2f, d]
// and down_proj [E, d, f]: no transposes are needed in either direction.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "mxtrain/params.hpp"
#include "mxtrain/safetensors.hpp"

namespace fs = std::filesystem;

namespace mxt {

namespace {

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

[[noreturn]] void fail(const std::string& what) { throw SafetensorsError("hf checkpoint: " + what); }

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The tensors of a checkpoint: one file, or the shards an index names.
class CheckpointSource {
 public:
  explicit CheckpointSource(const std::string& dir_or_file) {
    std::error_code ec;
    const fs::path p(dir_or_file);
    if (fs::is_directory(p, ec)) {
      if (fs::exists(p / kSingleFile, ec))
        open_single((p / kSingleFile).string());
      else if (fs::exists(p / kIndexFile, ec))
        open_index((p / kIndexFile).string());
      else
        fail("no " + std::string(kSingleFile) + " or " + kIndexFile + " in " + dir_or_file);
    } else if (fs::exists(p, ec)) {
      if (ends_with(dir_or_file, ".json"))
        open_index(dir_or_file);
      else
        open_single(dir_or_file);
    } else {
      fail("checkpoint not found: " + dir_or_file);
    }
  }

  const std::string& describe() const { return describe_; }
  const std::vector<std::string>& names() const { return names_; }
  // The file holding name, or nullptr.
  const SafetensorsFile* find(const std::string& name) const {
    auto it = where_.find(name);
    return it == where_.end() ? nullptr : &files_[it->second];
  }
  bool has(const std::string& name) const { return where_.count(name) != 0; }

 private:
  void open_single(const std::string& path) {
    files_.emplace_back(path);
    describe_ = path;
    for (const auto& n : files_.back().names()) {
      where_.emplace(n, 0);
      names_.push_back(n);
    }
  }

  void open_index(const std::string& index_path) {
    describe_ = index_path;
    std::ifstream in(index_path, std::ios::binary);
    if (!in) fail("cannot read index " + index_path);
    std::stringstream ss;
    ss << in.rdbuf();
    nlohmann::json idx;
    try {
      idx = nlohmann::json::parse(ss.str());
    } catch (const nlohmann::json::exception& e) {
      fail("index " + index_path + ": malformed JSON: " + e.what());
    }
    if (!idx.is_object() || !idx.contains("weight_map") || !idx["weight_map"].is_object())
      fail("index " + index_path + ": no \"weight_map\" object");
    const fs::path dir = fs::path(index_path).parent_path();
    std::map<std::string, size_t> shard_index;  // shard file name -> files_ index
    for (auto it = idx["weight_map"].begin(); it != idx["weight_map"].end(); ++it) {
      if (!it.value().is_string())
        fail("index " + index_path + ": weight_map entry '" + it.key() + "' is not a file name");
      const std::string shard = it.value().get<std::string>();
      auto s = shard_index.find(shard);
      if (s == shard_index.end()) {
        const fs::path shard_path = dir / shard;
        std::error_code ec;
        if (!fs::is_regular_file(shard_path, ec))
          fail("index " + index_path + " maps tensor '" + it.key() + "' to shard '" + shard +
               "', which does not exist (" + shard_path.string() + ")");
        files_.emplace_back(shard_path.string());
        s = shard_index.emplace(shard, files_.size() - 1).first;
      }
      if (!files_[s->second].has(it.key()))
        fail("index " + index_path + " maps tensor '" + it.key() + "' to shard '" + shard +
             "', which does not contain it");
      where_.emplace(it.key(), s->second);
      names_.push_back(it.key());
    }
  }

  std::vector<SafetensorsFile> files_;
  std::unordered_map<std::string, size_t> where_;
  std::vector<std::string> names_;
  std::string describe_;
};

// "model-00001-of-00003.safetensors": the shard names HF (and export_hf_weights) use.
bool is_shard_name(const std::string& s) {
  static const std::string pattern = "model-#####-of-#####.safetensors";
  if (s.size() != pattern.size()) return false;
  for (size_t i = 0; i < s.size(); ++i)
    if (pattern[i] == '#' ? !std::isdigit(static_cast<unsigned char>(s[i])) : s[i] != pattern[i]) return false;
  return true;
}

std::string layer_prefix(int64_t l) { return "model.layers." + std::to_string(l) + "."; }
std::string expert_name(int64_t l, int64_t j, const char* w) {
  return layer_prefix(l) + "block_sparse_moe.experts." + std::to_string(j) + "." + w + ".weight";
}

}  // namespace

// ---- import -----------------------------------------------------------------------------------------------

void import_hf_weights(const std::string& dir_or_file, const ParamLayout& layout, const ModelConfig& m,
                       std::vector<float>& dense, std::vector<float>& expert) {
  const int64_t E = m.num_local_experts, d = m.hidden_size, f = m.intermediate_size;
  const int64_t e0 = layout.first_expert, ne = layout.num_local_experts;
  if (e0 < 0 || ne < 0 || e0 + ne > E)
    fail("layout holds experts [" + std::to_string(e0) + ", " + std::to_string(e0 + ne) + ") but the model has " +
         std::to_string(E));

  const CheckpointSource src(dir_or_file);
  dense.assign(static_cast<size_t>(layout.dense_numel), 0.f);
  expert.assign(static_cast<size_t>(layout.expert_numel), 0.f);
  std::unordered_set<std::string> used;

  // The file holding name, after checking its shape; throws naming the tensor, both shapes and the file.
  auto need = [&](const std::string& name, const std::vector<int64_t>& shape) -> const SafetensorsFile& {
    const SafetensorsFile* file = src.find(name);
    if (!file)
      fail("tensor '" + name + "' (expected shape " + shape_to_string(shape) + ") not found in " + src.describe());
    const auto& found = file->info(name).shape;
    if (found != shape)
      fail("tensor '" + name + "' in " + file->path() + " has shape " + shape_to_string(found) + ", expected " +
           shape_to_string(shape));
    used.insert(name);
    return *file;
  };
  int64_t tensors_read = 0;
  auto load_whole = [&](const std::string& name, const std::vector<int64_t>& shape, float* dst) {
    const SafetensorsFile& file = need(name, shape);
    ++tensors_read;
    file.read_f32(name, 0, file.info(name).numel(), dst);
  };

  const std::string router_v4 = ".block_sparse_moe.gate.weight", router_v5 = ".mlp.gate.weight";
  for (const ParamInfo& p : layout.params) {
    if (p.expert) continue;
    float* dst = dense.data() + p.offset;
    std::string name = p.name;
    if (ends_with(name, router_v4)) {
      // transformers 5 calls the router "mlp.gate".
      const std::string v5 = name.substr(0, name.size() - router_v4.size()) + router_v5;
      if (!src.has(name) && src.has(v5)) name = v5;
    }
    if (name == "lm_head.weight" && !src.has(name)) {
      if (!m.tie_word_embeddings)
        fail("tensor 'lm_head.weight' (expected shape " + shape_to_string(p.shape) + ") not found in " +
             src.describe() + " and tie_word_embeddings is false");
      const ParamInfo& emb = layout.find("model.embed_tokens.weight");
      if (emb.shape != p.shape) fail("tied lm_head.weight: embedding shape differs from the LM head's");
      std::copy_n(dense.data() + emb.offset, p.numel, dst);  // embed_tokens comes first in the layout
      continue;
    }
    load_whole(name, p.shape, dst);
  }

  for (int64_t l = 0; l < m.num_hidden_layers; ++l) {
    const std::string pre = layer_prefix(l);
    const ParamInfo& w13 = layout.find(pre + "block_sparse_moe.experts.w13");
    const ParamInfo& w2 = layout.find(pre + "block_sparse_moe.experts.w2");
    float* w13_dst = expert.data() + w13.offset;
    float* w2_dst = expert.data() + w2.offset;
    const std::string fused_gu = pre + "mlp.experts.gate_up_proj", fused_down = pre + "mlp.experts.down_proj";
    const std::string first_w1 = expert_name(l, ne > 0 ? e0 : 0, "w1");
    const bool per_expert = src.has(first_w1);
    if (!per_expert && !src.has(fused_gu) && ne > 0)
      fail("tensor '" + first_w1 + "' (expected shape " + shape_to_string({f, d}) + ") not found in " +
           src.describe() + ", nor the transformers-5 fused '" + fused_gu + "' " +
           shape_to_string({E, 2 * f, d}));
    if (per_expert || !src.has(fused_gu)) {
      // transformers <= 4 naming: one [f, d] / [d, f] matrix per expert.
      for (int64_t j = 0; j < E; ++j) {
        if (j < e0 || j >= e0 + ne) {
          // Other ranks' experts: known tensors, just not ours.
          for (const char* w : {"w1", "w2", "w3"})
            if (src.has(expert_name(l, j, w))) used.insert(expert_name(l, j, w));
          continue;
        }
        const int64_t k = j - e0;
        load_whole(expert_name(l, j, "w1"), {f, d}, w13_dst + k * 2 * f * d);
        load_whole(expert_name(l, j, "w3"), {f, d}, w13_dst + k * 2 * f * d + f * d);
        load_whole(expert_name(l, j, "w2"), {d, f}, w2_dst + k * d * f);
      }
    } else {
      // transformers >= 5 naming: gate_up_proj [E, 2f, d] = per expert [w1; w3], down_proj [E, d, f] = w2.
      // Both have our per-expert row layout, so our experts are one contiguous element range of each.
      const SafetensorsFile& gu = need(fused_gu, {E, 2 * f, d});
      gu.read_f32(fused_gu, e0 * 2 * f * d, ne * 2 * f * d, w13_dst);
      const SafetensorsFile& dn = need(fused_down, {E, d, f});
      dn.read_f32(fused_down, e0 * d * f, ne * d * f, w2_dst);
      tensors_read += 2;
    }
  }

  std::vector<std::string> extra;
  for (const auto& n : src.names())
    if (!used.count(n)) extra.push_back(n);
  if (!extra.empty()) {
    std::string list;
    for (size_t i = 0; i < extra.size() && i < 10; ++i) list += (i ? ", " : "") + extra[i];
    if (extra.size() > 10) list += ", ... (" + std::to_string(extra.size() - 10) + " more)";
    spdlog::warn("hf checkpoint {}: ignoring {} unexpected tensor(s): {}", src.describe(), extra.size(), list);
  }
  spdlog::info("loaded HF weights from {} ({} tensors read, experts [{}, {}) of {})", src.describe(), tensors_read,
               e0, e0 + ne, E);
}

// ---- export -----------------------------------------------------------------------------------------------

std::string hf_config_json(const ModelConfig& m, DType dtype) {
  const char* torch_dtype = dtype == DType::BF16 ? "bfloat16" : "float32";
  nlohmann::ordered_json c;
  c["architectures"] = {"MixtralForCausalLM"};
  c["model_type"] = "mixtral";
  c["vocab_size"] = m.vocab_size;
  c["hidden_size"] = m.hidden_size;
  c["intermediate_size"] = m.intermediate_size;
  c["num_hidden_layers"] = m.num_hidden_layers;
  c["num_attention_heads"] = m.num_attention_heads;
  c["num_key_value_heads"] = m.num_key_value_heads;
  c["head_dim"] = m.head_dim();
  c["hidden_act"] = "silu";
  c["num_local_experts"] = m.num_local_experts;
  c["num_experts_per_tok"] = m.num_experts_per_tok;
  c["max_position_embeddings"] = m.max_position_embeddings;
  c["rope_theta"] = m.rope_theta;
  // transformers 5 reads RoPE settings from rope_parameters (and still converts a bare rope_theta).
  c["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", m.rope_theta}};
  c["rms_norm_eps"] = m.rms_norm_eps;
  c["initializer_range"] = m.initializer_range;
  c["router_aux_loss_coef"] = m.router_aux_loss_coef;
  c["router_jitter_noise"] = m.router_jitter_noise;
  c["output_router_logits"] = false;
  c["tie_word_embeddings"] = m.tie_word_embeddings;
  c["sliding_window"] = nullptr;
  c["attention_dropout"] = 0.0;
  c["use_cache"] = true;
  c["torch_dtype"] = torch_dtype;
  return c.dump(2) + "\n";
}

void export_hf_weights(const std::string& dir, const ParamLayout& layout, const ModelConfig& m,
                       const std::vector<float>& dense, const std::vector<float>& expert, DType dtype,
                       int64_t max_shard_bytes) {
  if (dtype != DType::F32 && dtype != DType::BF16)
    fail(std::string("export dtype must be F32 or BF16, not ") + dtype_name(dtype));
  if (layout.first_expert != 0 || layout.num_local_experts != m.num_local_experts)
    fail("export needs every expert in the layout (has [" + std::to_string(layout.first_expert) + ", " +
         std::to_string(layout.first_expert + layout.num_local_experts) + ") of " +
         std::to_string(m.num_local_experts) + "); gather the experts first");
  if (static_cast<int64_t>(dense.size()) != layout.dense_numel ||
      static_cast<int64_t>(expert.size()) != layout.expert_numel)
    fail("export buffers hold " + std::to_string(dense.size()) + " dense / " + std::to_string(expert.size()) +
         " expert values; the layout needs " + std::to_string(layout.dense_numel) + " / " +
         std::to_string(layout.expert_numel));
  if (max_shard_bytes <= 0) fail("max_shard_bytes must be positive");

  const int64_t d = m.hidden_size, f = m.intermediate_size;
  // HF order: each layer's tensors, experts as w1, w2, w3 per expert.
  std::vector<SafetensorsWriteEntry> entries;
  for (const ParamInfo& p : layout.params) {
    if (!p.expert) {
      entries.push_back({p.name, p.shape, dense.data() + p.offset});
      continue;
    }
    if (!ends_with(p.name, ".experts.w13")) continue;  // w2 goes out with w13
    const std::string pre = p.name.substr(0, p.name.size() - std::string("block_sparse_moe.experts.w13").size());
    const int64_t l = std::stoll(pre.substr(std::string("model.layers.").size()));
    const ParamInfo& w2 = layout.find(pre + "block_sparse_moe.experts.w2");
    for (int64_t j = 0; j < m.num_local_experts; ++j) {
      const float* w13 = expert.data() + p.offset + j * 2 * f * d;
      entries.push_back({expert_name(l, j, "w1"), {f, d}, w13});
      entries.push_back({expert_name(l, j, "w2"), {d, f}, expert.data() + w2.offset + j * d * f});
      entries.push_back({expert_name(l, j, "w3"), {f, d}, w13 + f * d});
    }
  }

  // Greedy sharding on data bytes; a tensor larger than the limit gets a shard of its own.
  std::vector<std::vector<size_t>> shards;
  int64_t cur = 0, total = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const int64_t b = safetensors_tensor_bytes(entries[i].shape, dtype);
    if (shards.empty() || (cur > 0 && cur + b > max_shard_bytes)) {
      shards.emplace_back();
      cur = 0;
    }
    shards.back().push_back(i);
    cur += b;
    total += b;
  }

  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir)) fail("cannot create export directory " + dir + (ec ? ": " + ec.message() : ""));
  const fs::path out(dir);

  std::set<std::string> written;
  if (shards.size() <= 1) {
    write_safetensors((out / kSingleFile).string(), entries, dtype);
    written.insert(kSingleFile);
  } else {
    nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
    const size_t n = shards.size();
    for (size_t s = 0; s < n; ++s) {
      char fname[64];
      std::snprintf(fname, sizeof fname, "model-%05zu-of-%05zu.safetensors", s + 1, n);
      std::vector<SafetensorsWriteEntry> part;
      for (size_t i : shards[s]) {
        part.push_back(entries[i]);
        weight_map[entries[i].name] = fname;
      }
      write_safetensors((out / fname).string(), part, dtype);
      written.insert(fname);
    }
    nlohmann::ordered_json idx;
    idx["metadata"] = {{"total_size", total}};
    idx["weight_map"] = std::move(weight_map);
    write_file_atomic((out / kIndexFile).string(), idx.dump(2) + "\n");
    written.insert(kIndexFile);
  }
  write_file_atomic((out / "config.json").string(), hf_config_json(m, dtype));

  // Drop an earlier export's files that would shadow or confuse this one (a stale model.safetensors wins over
  // an index in transformers' lookup order).
  for (const auto& entry : fs::directory_iterator(out, ec)) {
    const std::string name = entry.path().filename().string();
    const bool ours = name == kSingleFile || name == kIndexFile || is_shard_name(name);
    if (ours && !written.count(name)) {
      std::error_code rm;
      fs::remove(entry.path(), rm);
      if (rm) spdlog::warn("hf export: could not remove stale {}: {}", entry.path().string(), rm.message());
    }
  }
  spdlog::info("exported HF weights to {} ({} tensors, {} shard(s), {} bytes, {})", dir, entries.size(),
               shards.size(), total, dtype_name(dtype));
}

}  // namespace mxt
