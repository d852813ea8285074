// The typed view of a resolved config (TrainConfig) with the checks that need no run: sizes, shape
// divisibility, ranges, supported choices. validate_for_run adds those that need one: world size, files.
#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <utility>

#include "config/config_internal.hpp"

namespace fs = std::filesystem;

namespace mxt {
namespace {

using cfg::Kind;

// Typed reads by dotted key; each checks the value's kind, so a config that skipped the schema check
// (e.g. one read back from a checkpoint) still fails with the key named.
class Reader {
 public:
  explicit Reader(const YAML::Node& root) : root_(root) {}

  int64_t i(const std::string& key) const { return cfg::parse_int(at(key, Kind::Int).Scalar(), key); }
  double f(const std::string& key) const { return cfg::parse_float(at(key, Kind::Float).Scalar()); }
  bool b(const std::string& key) const { return cfg::parse_bool(at(key, Kind::Bool).Scalar()); }
  std::string s(const std::string& key) const {  // null reads as ""
    const YAML::Node n = at(key, Kind::String);
    return n.IsNull() ? "" : n.Scalar();
  }
  std::vector<std::string> strings(const std::string& key) const {
    std::vector<std::string> out;
    for (const YAML::Node& e : elements(key, Kind::String)) out.push_back(e.IsNull() ? "" : e.Scalar());
    return out;
  }
  std::vector<double> floats(const std::string& key) const {
    std::vector<double> out;
    for (const YAML::Node& e : elements(key, Kind::Float)) out.push_back(cfg::parse_float(e.Scalar()));
    return out;
  }

 private:
  YAML::Node at(const std::string& key, Kind kind) const {
    YAML::Node n = root_;
    for (const auto& seg : cfg::split(key, '.')) {
      const YAML::Node child = cfg::find(n, seg);
      if (!child.IsDefined()) throw ConfigError(fmt::format("missing config key '{}'", key));
      n.reset(child);  // rebind the handle (operator= would overwrite the node)
    }
    cfg::require_kind(n, kind, key);
    return n;
  }
  std::vector<YAML::Node> elements(const std::string& key, Kind kind) const {
    const YAML::Node list = at(key, Kind::List);
    std::vector<YAML::Node> out;
    for (size_t j = 0; j < list.size(); ++j) {
      cfg::require_kind(list[j], kind, fmt::format("{}[{}]", key, j));
      out.push_back(list[j]);
    }
    return out;
  }
  const YAML::Node& root_;
};

void require(bool ok, const std::string& message) {
  if (!ok) throw ConfigError(message);
}
void require_positive(int64_t v, const char* key) {
  require(v > 0, fmt::format("{} must be positive, got {}", key, v));
}
void require_non_negative(double v, const char* key) {
  require(v >= 0, fmt::format("{} must be >= 0, got {}", key, v));
}
void require_one_of(const std::string& v, std::initializer_list<const char*> allowed, const char* key) {
  std::string list;
  for (const char* a : allowed) {
    if (v == a) return;
    list += (list.empty() ? "" : ", ") + std::string(a);
  }
  throw ConfigError(fmt::format("{} must be one of {}; got '{}'", key, list, v));
}

void read_model(const Reader& r, ModelConfig& m) {
  m.vocab_size = r.i("config_kwargs.vocab_size");
  m.hidden_size = r.i("config_kwargs.hidden_size");
  m.intermediate_size = r.i("config_kwargs.intermediate_size");
  m.num_hidden_layers = r.i("config_kwargs.num_hidden_layers");
  m.num_attention_heads = r.i("config_kwargs.num_attention_heads");
  m.num_key_value_heads = r.i("config_kwargs.num_key_value_heads");
  m.num_local_experts = r.i("config_kwargs.num_local_experts");
  m.num_experts_per_tok = r.i("config_kwargs.num_experts_per_tok");
  m.max_position_embeddings = r.i("config_kwargs.max_position_embeddings");
  m.rope_theta = r.f("config_kwargs.rope_theta");
  m.rms_norm_eps = r.f("config_kwargs.rms_norm_eps");
  m.initializer_range = r.f("config_kwargs.initializer_range");
  m.router_aux_loss_coef = r.f("config_kwargs.router_aux_loss_coef");
  m.router_jitter_noise = r.f("config_kwargs.router_jitter_noise");
  m.tie_word_embeddings = r.b("config_kwargs.tie_word_embeddings");
}

void check_model(const ModelConfig& m) {
  require_positive(m.vocab_size, "config_kwargs.vocab_size");
  require_positive(m.hidden_size, "config_kwargs.hidden_size");
  require_positive(m.intermediate_size, "config_kwargs.intermediate_size");
  require_positive(m.num_hidden_layers, "config_kwargs.num_hidden_layers");
  require_positive(m.num_attention_heads, "config_kwargs.num_attention_heads");
  require_positive(m.num_key_value_heads, "config_kwargs.num_key_value_heads");
  require_positive(m.num_local_experts, "config_kwargs.num_local_experts");
  require_positive(m.num_experts_per_tok, "config_kwargs.num_experts_per_tok");
  require_positive(m.max_position_embeddings, "config_kwargs.max_position_embeddings");
  require(m.hidden_size % m.num_attention_heads == 0,
          fmt::format("config_kwargs.hidden_size ({}) must be divisible by config_kwargs.num_attention_heads ({})",
                      m.hidden_size, m.num_attention_heads));
  require(m.head_dim() % 2 == 0,
          fmt::format("the head dimension config_kwargs.hidden_size / config_kwargs.num_attention_heads = {} / {} "
                      "= {} must be even (RoPE rotates pairs)", m.hidden_size, m.num_attention_heads, m.head_dim()));
  require(m.num_attention_heads % m.num_key_value_heads == 0,
          fmt::format("config_kwargs.num_attention_heads ({}) must be divisible by "
                      "config_kwargs.num_key_value_heads ({})", m.num_attention_heads, m.num_key_value_heads));
  require(m.num_experts_per_tok <= m.num_local_experts,
          fmt::format("config_kwargs.num_experts_per_tok ({}) must be <= config_kwargs.num_local_experts ({})",
                      m.num_experts_per_tok, m.num_local_experts));
  require(m.rope_theta > 0, fmt::format("config_kwargs.rope_theta must be positive, got {}", m.rope_theta));
  require(m.rms_norm_eps > 0, fmt::format("config_kwargs.rms_norm_eps must be positive, got {}", m.rms_norm_eps));
  require_non_negative(m.initializer_range, "config_kwargs.initializer_range");
  require_non_negative(m.router_aux_loss_coef, "config_kwargs.router_aux_loss_coef");
  require(m.router_jitter_noise >= 0 && m.router_jitter_noise < 1,
          fmt::format("config_kwargs.router_jitter_noise must be in [0, 1), got {}", m.router_jitter_noise));
  require(!m.tie_word_embeddings,
          "config_kwargs.tie_word_embeddings=true is not supported (mxtrain's LM head is a separate matrix, "
          "as in Mixtral); set it to false");
}

void read_dataset(const Reader& r, DatasetConfig& d) {
  d.micro_batch_size = r.i("dataset.micro_batch_size");
  d.max_seq_length = r.i("dataset.max_seq_length");
  d.stride = r.i("dataset.stride");
  d.source = r.s("dataset.source");
  d.paths = r.strings("dataset.paths");
  d.weights = r.floats("dataset.weights");
  d.token_dtype = r.s("dataset.token_dtype");
  d.shuffle = r.b("dataset.shuffle");
  d.tokenizer = r.s("dataset.tokenizer");
  d.uppercase = r.b("dataset.uppercase");
  d.reverse_complement_prob = r.f("dataset.reverse_complement_prob");
  d.bos_token_id = r.i("dataset.bos_token_id");
  d.eos_token_id = r.i("dataset.eos_token_id");
  d.sep_token_id = r.i("dataset.sep_token_id");
  d.pad_token_id = r.i("dataset.pad_token_id");
  d.split_samples_in_token_packing = r.b("dataset.split_samples_in_token_packing");
  d.skip_bad_records = r.b("dataset.skip_bad_records");
  d.prefetch = r.i("dataset.prefetch");
  d.sequence_packing = r.b("use_sequence_packing");
}

void check_dataset(const DatasetConfig& d, const ModelConfig& m) {
  require_positive(d.micro_batch_size, "dataset.micro_batch_size");
  require_positive(d.max_seq_length, "dataset.max_seq_length");
  require(d.max_seq_length <= m.max_position_embeddings,
          fmt::format("dataset.max_seq_length ({}) must be <= config_kwargs.max_position_embeddings ({})",
                      d.max_seq_length, m.max_position_embeddings));
  require(d.stride >= 0 && d.stride < d.max_seq_length,
          fmt::format("dataset.stride ({}) must be >= 0 and smaller than dataset.max_seq_length ({})", d.stride,
                      d.max_seq_length));
  require_one_of(d.source, {"embedded", "random", "fasta", "fastq", "mmidx", "tokens", "auto"}, "dataset.source");
  if (d.builtin_source())
    require(d.paths.empty(), fmt::format("dataset.paths lists {} file(s) but dataset.source is '{}', which "
                                         "reads none; set dataset.source=fasta or tokens", d.paths.size(), d.source));
  else
    require(!d.paths.empty(), fmt::format("dataset.paths must list at least one file when dataset.source is '{}'",
                                          d.source));
  require(d.weights.empty() || d.weights.size() == d.paths.size(),
          fmt::format("dataset.weights lists {} weight(s) for {} path(s) in dataset.paths; give one per path, or "
                      "none to read the paths as one stream", d.weights.size(), d.paths.size()));
  for (size_t i = 0; i < d.weights.size(); ++i)
    require(d.weights[i] > 0 && std::isfinite(d.weights[i]),
            fmt::format("dataset.weights[{}] must be a positive number, got {}", i, d.weights[i]));
  require_one_of(d.token_dtype, {"uint16", "uint32"}, "dataset.token_dtype");
  require_one_of(d.tokenizer, {"byte", "nucleotide", "protein"}, "dataset.tokenizer");
  require(d.reverse_complement_prob >= 0 && d.reverse_complement_prob <= 1,
          fmt::format("dataset.reverse_complement_prob must be in [0, 1], got {}", d.reverse_complement_prob));
  require(d.reverse_complement_prob == 0 || d.tokenizer == "nucleotide",
          fmt::format("dataset.reverse_complement_prob={} needs dataset.tokenizer=nucleotide (got '{}')",
                      d.reverse_complement_prob, d.tokenizer));
  for (const auto& [key, id] : {std::pair<const char*, int64_t>{"dataset.bos_token_id", d.bos_token_id},
                                {"dataset.eos_token_id", d.eos_token_id},
                                {"dataset.sep_token_id", d.sep_token_id},
                                {"dataset.pad_token_id", d.pad_token_id}})
    require(id == -1 || (id >= 0 && id < m.vocab_size),
            fmt::format("{} ({}) must be in [0, config_kwargs.vocab_size ({})) or -1 (none)", key, id,
                        m.vocab_size));
  require(!d.sequence_packing || d.split_samples_in_token_packing || d.pad_token_id >= 0,
          "use_sequence_packing=true with dataset.split_samples_in_token_packing=false pads rows: set "
          "dataset.pad_token_id");
  require(d.prefetch >= 0, fmt::format("dataset.prefetch must be >= 0, got {}", d.prefetch));
}

void read_optimizer(const Reader& r, TrainConfig& c) {
  AdamWConfig& a = c.adamw;
  a.lr = r.f("adamw_kwargs.lr");
  const std::vector<double> betas = r.floats("adamw_kwargs.betas");
  require(betas.size() == 2,
          fmt::format("adamw_kwargs.betas must hold two values [beta1, beta2], got {}", betas.size()));
  a.beta1 = betas[0], a.beta2 = betas[1];
  a.eps = r.f("adamw_kwargs.eps");
  a.weight_decay = r.f("adamw_kwargs.weight_decay");
  r.b("adamw_kwargs.fused");  // the recipe's flag: read for its type, otherwise ignored
  c.adamw_moments_dtype = r.s("adamw_moments_dtype");
  LRSchedulerConfig& s = c.lr_scheduler;
  s.num_warmup_steps = r.i("lr_scheduler_kwargs.num_warmup_steps");
  s.num_decay_steps = r.i("lr_scheduler_kwargs.num_decay_steps");
  s.min_lr_ratio = r.f("lr_scheduler_kwargs.min_lr_ratio");
}

void check_optimizer(const TrainConfig& c) {
  const AdamWConfig& a = c.adamw;
  require_non_negative(a.lr, "adamw_kwargs.lr");
  for (int k = 0; k < 2; ++k) {
    const double beta = k == 0 ? a.beta1 : a.beta2;
    require(beta >= 0 && beta < 1, fmt::format("adamw_kwargs.betas[{}] must be in [0, 1), got {}", k, beta));
  }
  require(a.eps > 0, fmt::format("adamw_kwargs.eps must be positive, got {}", a.eps));
  require_non_negative(a.weight_decay, "adamw_kwargs.weight_decay");
  const LRSchedulerConfig& s = c.lr_scheduler;
  require_non_negative(static_cast<double>(s.num_warmup_steps), "lr_scheduler_kwargs.num_warmup_steps");
  require_non_negative(static_cast<double>(s.num_decay_steps), "lr_scheduler_kwargs.num_decay_steps");
  require(s.min_lr_ratio >= 0 && s.min_lr_ratio <= 1,
          fmt::format("lr_scheduler_kwargs.min_lr_ratio must be in [0, 1], got {}", s.min_lr_ratio));
  require(c.max_grad_norm > 0, fmt::format("max_grad_norm must be positive, got {}", c.max_grad_norm));
}

void read_rest(const Reader& r, TrainConfig& c) {
  c.num_train_steps = r.i("num_train_steps");
  c.grad_acc_steps = r.i("grad_acc_steps");
  c.max_grad_norm = r.f("max_grad_norm");
  const int64_t seed = r.i("seed");
  require(seed >= 0, fmt::format("seed must be >= 0, got {}", seed));
  c.seed = static_cast<uint64_t>(seed);
  c.backend = r.s("backend");
  c.output_dir = r.s("output_dir");
  c.init_from_pretrained = r.s("init_from_pretrained");
  c.recompute_experts = r.b("recompute_experts");
  c.model.router_force_load_balancing = r.b("router_force_load_balancing");
  c.expert_wgrad_micro_batches = r.i("expert_wgrad_micro_batches");
  c.expert_grad_dtype = r.s("expert_grad_dtype");
  c.lm_head_grad_dtype = r.s("lm_head_grad_dtype");
  c.optimizer_store_param_remainders = r.b("optimizer_store_param_remainders");
  c.lm_head_wgrad_micro_batches = r.i("lm_head_wgrad_micro_batches");
  c.lm_head_chunk_tokens = r.i("lm_head_chunk_tokens");
  c.cuda_graphs = r.b("cuda_graphs");
  c.parallelism.dp_size = r.i("parallelism.dp_size");
  c.parallelism.ep_size = r.i("parallelism.ep_size");
  c.parallelism.timeout_s = r.f("parallelism.timeout_s");
  c.parallelism.ep_capacity_factor = r.f("parallelism.ep_capacity_factor");
  c.parallelism.ep_overlap = r.b("parallelism.ep_overlap");
  c.parallelism.overlap_grad_reduce = r.b("parallelism.overlap_grad_reduce");
  c.parallelism.ep_rebalance_interval = r.i("parallelism.ep_rebalance_interval");
  c.fp8.enabled = r.b("fp8_config.enabled");
  c.fp8.fp8_recipe = r.s("fp8_config.fp8_recipe");
  c.fp8.fp8_format = r.s("fp8_config.fp8_format");
  c.fp8.keep_attention_bf16 = r.b("fp8_config.keep_attention_bf16");
  c.fp8.cache_columnwise_weights = r.b("fp8_config.cache_columnwise_weights");
  c.fp8.hopper_gemm = r.s("fp8_config.hopper_gemm");
  CheckpointConfig& k = c.checkpoint;
  k.ckpt_dir = r.s("checkpoint.ckpt_dir");
  k.save_every_n_steps = r.i("checkpoint.save_every_n_steps");
  k.resume_from_checkpoint = r.b("checkpoint.resume_from_checkpoint");
  k.max_checkpoints = r.i("checkpoint.max_checkpoints");
  k.save_final_model = r.b("checkpoint.save_final_model");
  k.final_model_dtype = r.s("checkpoint.final_model_dtype");
  k.async_save = r.b("checkpoint.async_save");
  c.logger.frequency = r.i("logger.frequency");
  c.logger.metrics_file = r.s("logger.metrics_file");
  c.validation.every_n_steps = r.i("validation.every_n_steps");
  c.validation.num_batches = r.i("validation.num_batches");
  c.validation.paths = r.strings("validation.paths");
  c.validation.metrics_file = r.s("validation.metrics_file");
}

// MXFP8 blocks 32 values along every GEMM's contraction dim: the widths, and (for the attention projections'
// wgrad, which contracts over tokens) the tokens of a micro-batch. Expert token counts are padded instead.
void check_fp8_shapes(const TrainConfig& c) {
  auto mult32 = [](int64_t v, const std::string& what) {
    require(v % 32 == 0, fmt::format("fp8_config.enabled=true needs {} ({}) to be a multiple of 32 (MXFP8 blocks "
                                     "of 32 along each GEMM's contraction dim)", what, v));
  };
  const ModelConfig& m = c.model;
  mult32(m.hidden_size, "config_kwargs.hidden_size");
  mult32(m.intermediate_size, "config_kwargs.intermediate_size");
  if (c.fp8.keep_attention_bf16) return;
  mult32(m.num_key_value_heads * m.head_dim(),
         "config_kwargs.num_key_value_heads x head_dim (the K/V projection width)");
  mult32(c.dataset.micro_batch_size * c.dataset.max_seq_length,
         "dataset.micro_batch_size x dataset.max_seq_length (tokens per micro-batch; or set "
         "fp8_config.keep_attention_bf16=true)");
}

// expert_grad_dtype=bfloat16: each expert gradient is stored once per step by one GEMM, never added to in bf16.
// (The backend's activation dtype is checked where it is known: Trainer.)
void check_bf16_expert_grads(const TrainConfig& c) {
  const std::string why = "expert_grad_dtype=bfloat16 needs ";
  require(c.backend != "cpu" && c.backend != "cuda-fp32",
          why + "the CUDA bf16 backend (backend=cuda or auto on a GPU), got backend=" + c.backend);
  require(!c.fp8.enabled, why + "fp8_config.enabled=false (MXFP8 adds each micro-batch's expert gradients)");
  require(c.expert_wgrad_micro_batches >= c.grad_acc_steps,
          fmt::format("{}expert_wgrad_micro_batches >= grad_acc_steps ({}), so that one GEMM per step stores each "
                      "expert gradient; got expert_wgrad_micro_batches={}",
                      why, c.grad_acc_steps, c.expert_wgrad_micro_batches));
  require(c.parallelism.dp_size == 1,
          fmt::format("{}parallelism.dp_size=1 (expert gradients are summed over dp replicas in fp32); got {}", why,
                      c.parallelism.dp_size));
  require(c.parallelism.ep_rebalance_interval == 0 || c.parallelism.ep_size == 1,
          fmt::format("{}parallelism.ep_rebalance_interval=0 (expert moves stage through the fp32 gradient buffer); "
                      "got {}", why, c.parallelism.ep_rebalance_interval));
}

// lm_head_grad_dtype=bfloat16: the LM head's gradient is stored once per step by the held group's one GEMM.
void check_bf16_lm_head_grad(const TrainConfig& c) {
  const std::string why = "lm_head_grad_dtype=bfloat16 needs ";
  require(c.backend != "cpu" && c.backend != "cuda-fp32",
          why + "the CUDA bf16 backend (backend=cuda or auto on a GPU), got backend=" + c.backend);
  require(c.grad_acc_steps >= 2 && c.lm_head_wgrad_micro_batches >= c.grad_acc_steps,
          fmt::format("{}lm_head_wgrad_micro_batches >= grad_acc_steps >= 2, so that one GEMM per step stores the "
                      "LM head's gradient; got lm_head_wgrad_micro_batches={}, grad_acc_steps={}",
                      why, c.lm_head_wgrad_micro_batches, c.grad_acc_steps));
  require(c.parallelism.dp_size * c.parallelism.ep_size == 1,
          fmt::format("{}one rank (dense gradients are summed over every rank in fp32); got parallelism.dp_size={} "
                      "x parallelism.ep_size={}", why, c.parallelism.dp_size, c.parallelism.ep_size));
}

void check_rest(TrainConfig& c) {
  require_positive(c.num_train_steps, "num_train_steps");
  require_positive(c.lm_head_chunk_tokens, "lm_head_chunk_tokens");
  require_positive(c.expert_wgrad_micro_batches, "expert_wgrad_micro_batches");
  require_positive(c.lm_head_wgrad_micro_batches, "lm_head_wgrad_micro_batches");
  require(c.grad_acc_steps >= 1, fmt::format("grad_acc_steps must be >= 1, got {}", c.grad_acc_steps));
  require_one_of(c.backend, {"auto", "cpu", "cuda", "cuda-fp32"}, "backend");
  require_one_of(c.fp8.hopper_gemm, {"fp8", "bf16"}, "fp8_config.hopper_gemm");
  require_one_of(c.checkpoint.final_model_dtype, {"float32", "bfloat16"}, "checkpoint.final_model_dtype");
  require_one_of(c.adamw_moments_dtype, {"float32", "bfloat16"}, "adamw_moments_dtype");
  require_one_of(c.expert_grad_dtype, {"float32", "bfloat16"}, "expert_grad_dtype");
  if (c.expert_grad_dtype == "bfloat16") check_bf16_expert_grads(c);
  require_one_of(c.lm_head_grad_dtype, {"float32", "bfloat16"}, "lm_head_grad_dtype");
  if (c.lm_head_grad_dtype == "bfloat16") check_bf16_lm_head_grad(c);
  if (c.optimizer_store_param_remainders) {
    const std::string why = "optimizer_store_param_remainders=true needs ";
    require(c.backend != "cpu" && c.backend != "cuda-fp32",
            why + "the CUDA bf16 backend (backend=cuda or auto on a GPU), got backend=" + c.backend);
    require(c.parallelism.ep_rebalance_interval == 0 || c.parallelism.ep_size == 1,
            fmt::format("{}parallelism.ep_rebalance_interval=0 (expert moves carry the fp32 master); got {}", why,
                        c.parallelism.ep_rebalance_interval));
  }
  require(!c.output_dir.empty(), "output_dir must not be empty");
  require_positive(c.parallelism.dp_size, "parallelism.dp_size");
  require_positive(c.parallelism.ep_size, "parallelism.ep_size");
  require_non_negative(c.parallelism.ep_capacity_factor, "parallelism.ep_capacity_factor");
  require_non_negative(static_cast<double>(c.parallelism.ep_rebalance_interval), "parallelism.ep_rebalance_interval");
  require(c.model.num_local_experts % c.parallelism.ep_size == 0,
          fmt::format("config_kwargs.num_local_experts ({}) must be divisible by parallelism.ep_size ({})",
                      c.model.num_local_experts, c.parallelism.ep_size));
  // TE's qualified class name means the same recipe.
  const std::string te_prefix = "transformer_engine.common.recipe.";
  if (c.fp8.fp8_recipe.rfind(te_prefix, 0) == 0) c.fp8.fp8_recipe.erase(0, te_prefix.size());
  require_one_of(c.fp8.fp8_recipe, {"MXFP8BlockScaling"}, "fp8_config.fp8_recipe");
  require_one_of(c.fp8.fp8_format, {"E4M3", "HYBRID"}, "fp8_config.fp8_format");
  if (c.fp8.enabled) check_fp8_shapes(c);
  require(!(c.fp8.enabled && c.backend == "cuda-fp32"),
          "fp8_config.enabled=true needs backend=cuda (or cpu): backend=cuda-fp32 has no MXFP8 path");
  require_non_negative(static_cast<double>(c.checkpoint.save_every_n_steps), "checkpoint.save_every_n_steps");
  require_non_negative(static_cast<double>(c.checkpoint.max_checkpoints), "checkpoint.max_checkpoints");
  require_positive(c.logger.frequency, "logger.frequency");
  require_non_negative(c.validation.every_n_steps, "validation.every_n_steps");
  require_positive(c.validation.num_batches, "validation.num_batches");
  if (c.validation.every_n_steps > 0) {
    require(!c.dataset.builtin_source(),
            fmt::format("validation.every_n_steps > 0 needs held-out data, but dataset.source is '{}' (no files, "
                        "nothing held out): set dataset.source and dataset.paths, and validation.paths",
                        c.dataset.source));
    require(!c.validation.paths.empty(), fmt::format("validation.every_n_steps={} needs validation.paths (held-out "
                                                     "files read like dataset.paths)", c.validation.every_n_steps));
  }
}

}  // namespace

TrainConfig to_train_config(const YAML::Node& resolved) {
  const Reader r(resolved);
  TrainConfig c;
  read_model(r, c.model);
  read_dataset(r, c.dataset);
  read_optimizer(r, c);
  read_rest(r, c);
  check_model(c.model);
  check_dataset(c.dataset, c.model);
  check_optimizer(c);
  check_rest(c);
  return c;
}

DatasetConfig validation_dataset(const TrainConfig& cfg) {
  DatasetConfig d = cfg.dataset;
  d.paths = cfg.validation.paths;
  d.weights.clear();
  d.reverse_complement_prob = 0;
  d.prefetch = 0;
  return d;
}

void validate_for_run(const TrainConfig& c, int world_size) {
  const int64_t dp = c.parallelism.dp_size, ep = c.parallelism.ep_size;
  require(world_size >= 1, fmt::format("the job has {} rank(s)", world_size));
  if (dp * ep != world_size) {
    // Suggest the smallest change that fits this job: the EP size if it can take up the difference.
    std::string fix = fmt::format("set parallelism.dp_size x parallelism.ep_size = {}", world_size);
    if (world_size % dp == 0 && c.model.num_local_experts % (world_size / dp) == 0)
      fix = fmt::format("set parallelism.ep_size={}", world_size / dp);
    else if (world_size % ep == 0)
      fix = fmt::format("set parallelism.dp_size={}", world_size / ep);
    throw ConfigError(fmt::format("parallelism.dp_size ({}) x parallelism.ep_size ({}) = {} but the job has {} "
                                  "rank(s); run under mpirun -np {} or {}", dp, ep, dp * ep, world_size,
                                  dp * ep, fix));
  }
  if (!c.dataset.builtin_source()) {
    for (const auto& p : c.dataset.paths) {
      // A glob or an indexed-dataset prefix names no single file: open_corpus checks what it expands to.
      if (p.find_first_of("*?[") != std::string::npos) continue;
      if (c.dataset.source == "mmidx" || (c.dataset.source == "auto" && fs::exists(p + ".idx"))) {
        const bool has_ext = p.size() > 4 && (p.compare(p.size() - 4, 4, ".idx") == 0 ||
                                              p.compare(p.size() - 4, 4, ".bin") == 0);
        const std::string prefix = has_ext ? p.substr(0, p.size() - 4) : p;
        for (const char* ext : {".idx", ".bin"})
          require(fs::is_regular_file(prefix + ext),
                  fmt::format("dataset.paths: indexed dataset {}: file not found: {}{}", p, prefix, ext));
        continue;
      }
      std::error_code ec;
      const auto st = fs::status(p, ec);
      require(fs::exists(st), fmt::format("dataset.paths: file not found: {}", p));
      require(fs::is_regular_file(st), fmt::format("dataset.paths: not a regular file: {}", p));
      require(static_cast<bool>(std::ifstream(p, std::ios::binary)),
              fmt::format("dataset.paths: cannot read file: {} (permissions?)", p));
    }
  }
  if (!c.init_from_pretrained.empty())
    require(fs::is_directory(c.init_from_pretrained),
            fmt::format("init_from_pretrained: directory not found: {}", c.init_from_pretrained));
}

}  // namespace mxt
