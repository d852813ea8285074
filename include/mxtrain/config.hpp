#pragma once
// Configuration: YAML files in the recipe's key layout (defaults.yaml + L0_sanity.yaml / L1_8x7B_ep.yaml +
// model shape files), Hydra-style overrides, validation, and the typed view the trainer uses.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace YAML { class Node; }

namespace mxt {

// Every bad-config error: the message names the key, the value and what was expected.
struct ConfigError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// HF MixtralConfig fields (config_kwargs).
struct ModelConfig {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t num_local_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t max_position_embeddings = 0;
  double rope_theta = 1e6;
  double rms_norm_eps = 1e-5;
  double initializer_range = 0.02;
  double router_aux_loss_coef = 0.0;
  double router_jitter_noise = 0.0;
  bool tie_word_embeddings = false;
  // The top-level key router_force_load_balancing (not an HF field): benchmarking only. Every token is sent to a
  // fixed round-robin set of experts, so every expert receives exactly T*k/E rows of a micro-batch (T*k a
  // multiple of E), whatever the router weights. Measures the system without the router's load imbalance, as
  // Megatron-Core's --moe-router-force-load-balancing does; the model then does not learn to route.
  bool router_force_load_balancing = false;
  int64_t head_dim() const { return hidden_size / num_attention_heads; }
};

struct DatasetConfig {
  int64_t micro_batch_size = 1;
  int64_t max_seq_length = 128;
  int64_t stride = 0;            // tokens shared by consecutive windows (HF tokenizer "stride")
  std::string source = "embedded";  // embedded | random | fasta | fastq | mmidx | tokens | auto (by file name)
  std::vector<std::string> paths;   // files, globs or indexed-dataset prefixes
  std::vector<double> weights;      // one blend weight per path; empty: all paths read as one stream
  std::string token_dtype = "uint16";  // flat token files: uint16 | uint32
  bool shuffle = true;
  // The built-in sources (embedded, random) read no files.
  bool builtin_source() const { return source == "embedded" || source == "random"; }
  std::string tokenizer = "byte";   // FASTA/FASTQ: byte | nucleotide | protein
  bool uppercase = true;            // byte / nucleotide: upper-case residues
  double reverse_complement_prob = 0.0;  // nucleotide: chance a unit is read reverse-complemented
  int64_t bos_token_id = -1;  // before each FASTA/FASTQ record; -1: none
  int64_t eos_token_id = 0;   // after each FASTA/FASTQ record; -1: none
  int64_t sep_token_id = -1;  // between records of the unpacked stream; -1: none
  int64_t pad_token_id = 1;   // input id of padding (packed rows whose documents are not split)
  bool split_samples_in_token_packing = true;  // packing: split a document at a row end (else pad the row)
  bool skip_bad_records = false;  // skip (count, log) malformed records instead of failing
  int64_t prefetch = 4;       // micro-batches the background reader prepares ahead; 0: none
  bool sequence_packing = false;  // the recipe's top-level use_sequence_packing
};

struct AdamWConfig {
  double lr = 3e-3, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.033;
};

struct LRSchedulerConfig {
  int64_t num_warmup_steps = 0, num_decay_steps = 0;
  double min_lr_ratio = 0.0;
};

struct ParallelismConfig {
  int64_t dp_size = 1, ep_size = 1;
  double timeout_s = 600;           // a collective not done after this long aborts the job (<= 0: never)
  double ep_capacity_factor = 0.0;  // expert receive buffers in rows, x T*k; 0: the worst case (never overflows)
  bool ep_overlap = true;           // the backward's expert combine runs alongside the expert weight gradients
  bool overlap_grad_reduce = false;  // each layer's gradients reduced as the last backward finishes with them
  int64_t ep_rebalance_interval = 0;  // every N steps re-place experts over the EP ranks by that step's load; 0: off
};

struct Fp8Config {
  bool enabled = false;
  std::string fp8_recipe = "MXFP8BlockScaling";
  std::string fp8_format = "E4M3";
  bool keep_attention_bf16 = false;  // with enabled: QKV / O projections stay bf16 (experts still MXFP8)
  bool cache_columnwise_weights = true;  // false: the backward quantises each layer's dgrad copies when needed
  // How the MXFP8 GEMMs run on Hopper: "fp8" = FP8 wgmma with the 32-block scales applied on the CUDA cores;
  // "bf16" = the same quantised values dequantised to bf16 and multiplied on the bf16 tensor cores.
  std::string hopper_gemm = "bf16";
  // MXFP8 on the FP8-wgmma kernels (hopper_gemm=fp8), which keep E4M3 weight copies and their own wgrad kernels.
  bool fp8_kernels() const { return enabled && hopper_gemm != "bf16"; }
  // MXFP8 on the bf16 GEMMs (dequantised operands; bf16 weight copies of both directions).
  bool bf16_gemms() const { return enabled && hopper_gemm == "bf16"; }
};

struct CheckpointConfig {
  std::string ckpt_dir;
  int64_t save_every_n_steps = 0;
  bool resume_from_checkpoint = false;
  int64_t max_checkpoints = 0;
  bool save_final_model = false;
  std::string final_model_dtype = "float32";  // float32 | bfloat16
  bool async_save = false;
};

struct LoggerConfig {
  int64_t frequency = 1;
  std::string metrics_file;  // JSON lines; empty: <output_dir>/metrics.jsonl
};

struct ValidationConfig {
  int64_t every_n_steps = 0;  // evaluate every n steps and after the last; 0: never
  int64_t num_batches = 8;    // micro-batches per rank per evaluation
  std::vector<std::string> paths;  // held-out data, read like dataset.paths
  std::string metrics_file;   // JSON lines; empty: <output_dir>/validation.jsonl
};

struct TrainConfig {
  ModelConfig model;
  DatasetConfig dataset;
  AdamWConfig adamw;
  std::string adamw_moments_dtype = "float32";  // float32 (the recipe's) | bfloat16: AdamW's two moments as stored
  LRSchedulerConfig lr_scheduler;
  ParallelismConfig parallelism;
  Fp8Config fp8;
  CheckpointConfig checkpoint;
  LoggerConfig logger;
  ValidationConfig validation;
  int64_t num_train_steps = 0;
  int64_t grad_acc_steps = 1;
  double max_grad_norm = 1.0;
  uint64_t seed = 42;
  std::string backend = "auto";  // auto | cpu | cuda
  std::string output_dir = "outputs";
  std::string init_from_pretrained;  // HF safetensors directory; empty: random init
  bool recompute_experts = false;    // the backward recomputes h13 and the SwiGLU output instead of keeping them
  int64_t expert_wgrad_micro_batches = 1;  // bf16 experts: micro-batches per expert weight-gradient grouped GEMM
  std::string expert_grad_dtype = "float32";  // float32 | bfloat16: the expert weight gradients as stored
  bool optimizer_store_param_remainders = false;  // the fp32 master as the bf16 working copy + a 16-bit remainder
  int64_t lm_head_wgrad_micro_batches = 1;  // micro-batches per LM-head weight-gradient GEMM (their logits' grads held)
  std::string lm_head_grad_dtype = "float32";  // float32 | bfloat16: the LM head's weight gradient as stored
  int64_t lm_head_chunk_tokens = 4096;  // tokens whose LM-head logits exist at once
  bool cuda_graphs = true;           // replay each micro-batch's forward + backward as a captured graph (1 GPU)
  std::string resolved_yaml;         // the resolved config as YAML (set by main; saved in checkpoints)
};

struct LoadOptions {
  std::string config_name;                // e.g. "L0_sanity" (with or without .yaml)
  std::string config_path;                // directory; empty: the configs embedded in the binary
  std::vector<std::string> overrides;     // "a.b=c", "+a.b=c"
};

// Resolve a config: load, merge its `defaults:` list, apply overrides, check keys and types against the
// schema (configs/defaults.yaml). Throws ConfigError naming the key / file / value.
YAML::Node resolve_config(const LoadOptions& opt);
// Typed view plus semantic checks that do not depend on the run (shape divisibility, ranges).
TrainConfig to_train_config(const YAML::Node& resolved);
// The dataset settings the held-out loss reads validation.paths with: dataset's, one stream (no blend weights),
// no reverse complement, no prefetch thread.
DatasetConfig validation_dataset(const TrainConfig& cfg);
// Checks that depend on the run: world size, data files present.
void validate_for_run(const TrainConfig& cfg, int world_size);
// YAML text of a resolved config (for --cfg job and checkpoints).
std::string dump_config(const YAML::Node& resolved);

// The configs compiled into the binary: name -> YAML text ("defaults", "L0_sanity", "model/mixtral-8x7B"...).
const std::vector<std::pair<std::string, std::string>>& embedded_configs();

}  // namespace mxt
