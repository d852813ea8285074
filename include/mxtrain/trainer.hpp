#pragma once
// The training loop: micro-batches with gradient accumulation, global-norm clipping, AdamW, the LR schedule,
// logging. One code path for every backend.
#include <cstdint>
#include <array>
#include <memory>
#include <string>
#include <vector>

#include "mxtrain/arena.hpp"
#include "mxtrain/comm.hpp"
#include "mxtrain/config.hpp"
#include "mxtrain/data.hpp"
#include "mxtrain/model.hpp"
#include "mxtrain/ops.hpp"
#include "mxtrain/params.hpp"

namespace mxt {

class Checkpointer;
struct TrainState;

// One held-out evaluation over all ranks.
struct ValidationResult {
  double loss = 0;      // mean token cross-entropy (no aux loss)
  int64_t tokens = 0;   // labelled tokens evaluated, over all ranks
  double seconds = 0;
};

struct StepResult {
  double loss = 0;       // mean cross-entropy (+ coef * aux) over the step's micro-batches
  double aux_loss = 0;   // mean load-balancing loss (0 when off)
  double grad_norm = 0;  // before clipping
  double lr = 0;
  // The stop signal (stop_signal.hpp) most ranks had caught by this step's loss reduction, and on how many ranks;
  // 0 and 0 when none had.
  int stop_signal = 0, stop_ranks = 0;
};

// Distributed (groups of more than one rank, see comm.hpp for the layout): every rank reads its own
// micro-batches; the step equals one rank training on all ranks' micro-batches (acc x world of them, loss =
// mean of the micro-batch token means): dense gradients are summed over the world, expert gradients over the
// DP group, each reduce-scattered (ZeRO-1: AdamW moments only for this rank's shard, then an all-gather of
// the updated master weights); the clipping norm sums the disjoint shards over the world.
class Trainer {
 public:
  // groups: null = one process.
  Trainer(const TrainConfig& cfg, Ops& ops, Corpus tokens,
          std::shared_ptr<ProcessGroups> groups = nullptr);
  StepResult train_step();  // one optimizer step
  // Runs until num_train_steps, logging every logger.frequency steps; returns the per-step losses.
  std::vector<double> run();
  // run() ended before num_train_steps because a rank caught a stop signal (after saving a checkpoint where
  // checkpoint.ckpt_dir is set).
  bool stopped_early() const { return stopped_early_; }
  // Held-out data (main opens validation.paths with validation_dataset): run() then evaluates every
  // validation.every_n_steps and after its last step.
  void set_validation_data(Corpus corpus);
  // Forward only, collective: the mean token cross-entropy of validation.num_batches micro-batches per rank,
  // the same micro-batches every call. Changes no training state (weights, data position, jitter stream).
  ValidationResult evaluate();
  // One forward + backward of the first micro-batch, no update: writes into dir the gradients as an HF
  // checkpoint (grads/, HF names), logits.safetensors ("logits" [T, V] F32) and loss.json. For parity checks.
  void dump_first_batch(const std::string& dir);
  // Host copies of the fp32 master weights (this rank's experts). Collective over all ranks when the dense master
  // is sharded (world size > 1).
  void master_weights(std::vector<float>& dense, std::vector<float>& expert);
  // The HF checkpoint of save_final_model, into dir.
  void export_final_model(const std::string& dir);

  int64_t step() const { return step_; }
  // parallelism.ep_rebalance_interval: for every slot [layer * E + g], the expert (as labelled when this process
  // started) that it holds now; and how many slots have changed expert so far.
  const std::vector<int32_t>& expert_origin() const { return expert_origin_; }
  int64_t experts_moved() const { return experts_moved_; }
  // Whether micro-batches are replayed as captured graphs (cuda_graphs, from the second step; false after a
  // capture failed and the trainer went back to eager).
  bool replaying_graphs() const { return graphs_on_; }
  MixtralModel& model() { return *model_; }
  const ParamLayout& layout() const { return layout_; }
  FlatParams& dense() { return dense_; }
  FlatParams& expert() { return expert_; }
  // The expert weights the model reads: the working copy, or the fp32 master where there is none
  // (MXFP8 on a bf16 backend, see has_expert_working_copy).
  const Tensor& expert_weights() const { return expert_.working.data ? expert_.working : expert_.master; }
  const ProcessGroups& groups() const { return *groups_; }
  const ParamShard& dense_shard() const { return dense_shard_; }
  const ParamShard& expert_shard() const { return expert_shard_; }
  ~Trainer();
  // What a checkpoint saves and restores (checkpoint.hpp); checkpoint.ckpt_dir drives saving and resuming.
  TrainState ckpt_state();

 private:
  // master -> working copy after the optimizer step; *_written: the step already wrote that copy (this rank's part)
  void refresh_working_weights(bool dense_written = false, bool expert_written = false);
  // A role's whole fp32 master (n elements) from or to the host, split or joined where it is held split.
  void upload_master(FlatParams& fp, const float* host, int64_t n);
  void download_master(const FlatParams& fp, float* host, int64_t n);
  // The part of fp's working copy that this rank's AdamW step writes as it updates the master (empty: none).
  Tensor fused_working(const FlatParams& fp, const ParamShard& shard, bool sharded_master) const;
  void stop_early(int sig, int stop_ranks);  // a rank caught a stop signal: save, then run() returns
  void log_device_memory();        // peak allocated by the backend against the plan
  void load_batch(BatchLoader& from);  // next batch of `from` (training or validation) -> mb_; n_valid_
  void start_grad_reduce(int part);  // parallelism.overlap_grad_reduce: one part's gradient ranges (trainer.cpp)
  // parallelism.ep_rebalance_interval, after a step: re-places experts by that step's rows (expert_rebalance.cpp)
  void rebalance_experts();
  void permute_router_rows(const std::vector<std::vector<int>>& src);
  void move_expert_slots(const std::vector<std::vector<int>>& src);
  std::vector<double> expert_slot_sums();  // MXTRAIN_CHECK_REBALANCE
  void check_working_copies();             // MXTRAIN_CHECK_REBALANCE
  std::vector<int32_t> expert_origin_;
  int64_t experts_moved_ = 0;
  std::vector<std::array<int64_t, 4>> grad_parts_;  // start_grad_reduce's ranges, built on first use
  // cuda_graphs: micro-batch i's forward + backward, captured on the second step (the first allocates the ops'
  // scratch) and replayed after; recaptured when its loss scale changes.
  struct MicroGraph {
    void* exec = nullptr;
    float ce_scale = 0.f;
    bool quantizes = false;  // captured with the once-per-step MXFP8 weight quantisation in it
  };
  bool graphs_usable() const;
  double forward_backward_graphed(int64_t i, float ce_scale, float aux_scale, uint64_t jitter_seed);
  std::vector<MicroGraph> graphs_;
  bool graphs_on_ = false, graphs_warm_ = false;
  bool expert_norm_in_wgrad_ = false;  // the expert weight-gradient GEMMs add to norm_acc_ (one replica each)
  bool dense_master_sharded_ = false;  // world > 1: each rank keeps only its ZeRO shard of the dense fp32 master

  TrainConfig cfg_;
  Ops& ops_;
  std::shared_ptr<ProcessGroups> groups_;
  int rank_, world_;  // world rank and size (the loader's sharding)
  ParamLayout layout_;
  Arena state_;  // parameters, optimizer state, batch inputs, scalars
  FlatParams dense_, expert_;
  // lm_head_grad_dtype=bfloat16: the LM head's gradient, stored there by its one GEMM per step instead of in its
  // slice of dense_.grad (which then ends where the head begins); the norm and AdamW read it in bf16.
  Tensor head_grad_;
  ParamShard dense_shard_, expert_shard_;  // ZeRO-1 over the world (dense) and the DP group (experts)
  MicroBatch mb_;
  Tensor loss_slots_, norm_acc_;
  std::unique_ptr<MixtralModel> model_;
  BatchLoader loader_;
  Batch batch_;
  int64_t n_valid_ = 0;  // labelled tokens in the current micro-batch
  std::unique_ptr<BatchLoader> val_loader_;  // set_validation_data; null: no evaluation
  Tensor val_loss_;  // [1] F32 (in state_): summed token cross-entropy of an evaluation
  int64_t step_ = 0;
  bool stopped_early_ = false;
  std::unique_ptr<Checkpointer> ckpt_;  // null without checkpoint.ckpt_dir; last: joins its save thread first
};

// Bytes per rank that the config will use: parameters + optimizer state, and the activation arena.
struct MemoryPlan {
  int64_t dense_params = 0, expert_params = 0;
  size_t param_bytes = 0, activation_bytes = 0;
  size_t fp8_weight_bytes = 0;  // fp8_config.enabled: the MXFP8 weight copies (quantised once per step)
  size_t expert_working_bytes = 0;  // part of param_bytes: the experts' working copy (0 if none)
  DType act_dtype = DType::F32;     // the backend's activation / working-weight dtype the plan is for
  size_t scratch_bytes = 0;  // the ops' own temporaries: the LM-head loss's logits chunk and per-token losses
  int64_t lm_head_rows = 0;  // tokens per LM-head chunk (lm_head_chunk_rows)
  // The attention backward's dS tiles (mxtrain/attention_ds.hpp) on a bf16 backend where the shape allows them
  // (counted wherever it does; a GPU without sm_90a kernels recomputes instead and leaves them unallocated).
  size_t attention_ds_bytes = 0;
  // The expert weight gradient's gathered tail rows (mxtrain/wgrad_tails.hpp) on a bf16 backend that contracts
  // several micro-batches per call (expert_wgrad_micro_batches > 1): one call's worth, shared by every layer.
  size_t wgrad_tail_bytes = 0;
  std::vector<std::pair<std::string, size_t>> largest;  // biggest activation buffers
  size_t total_bytes() const {
    return param_bytes + fp8_weight_bytes + activation_bytes + scratch_bytes + attention_ds_bytes + wgrad_tail_bytes;
  }
};
MemoryPlan plan_memory(const TrainConfig& cfg, Ops& ops);
// The plan for a backend whose activations (and working weights) are act_dtype (CPU: F32, CUDA: BF16), without
// that backend: --dry-run backend=cuda plans the bf16 layout on a machine with no GPU.
MemoryPlan plan_memory(const TrainConfig& cfg, DType act_dtype);

// Whether the trainer keeps a separate working copy of the expert weights in act_dtype. Not on an F32 backend
// (the master is the working copy), and not with fp8_config.enabled: the experts then read only their MXFP8
// copies, quantised straight from the fp32 master ("persistent MXFP8 weights"; saves 2 bytes per expert param).
bool has_expert_working_copy(const Fp8Config& fp8, DType act_dtype);
std::string format_memory_plan(const TrainConfig& cfg, const MemoryPlan& p);
// Before anything is allocated: whether the plan fits free_bytes of device memory with room for what it does not
// count (NCCL's buffers, cuBLASLt, the ops' small scratch: kPlanHeadroom). Returns "" when it fits, else the
// message to fail with (the shortfall, the largest items and the keys that shrink them). free_bytes 0: no check.
inline constexpr size_t kPlanHeadroom = size_t{1} << 30;
std::string plan_fit_problem(const TrainConfig& cfg, const MemoryPlan& p, size_t free_bytes);

}  // namespace mxt
