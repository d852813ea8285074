#include "mxtrain/trainer.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "cpu/cpu_ops.hpp"
#include "mxtrain/attention_ds.hpp"
#include "mxtrain/wgrad_tails.hpp"
#include "mxtrain/checkpoint.hpp"
#include "mxtrain/cpus.hpp"
#include "mxtrain/init_cache.hpp"
#include "mxtrain/master_transfer.hpp"
#include "mxtrain/lr_schedule.hpp"
#include "mxtrain/metrics.hpp"
#include "mxtrain/safetensors.hpp"
#include "mxtrain/stop_signal.hpp"
#include "mxtrain/trace.hpp"

#include <nlohmann/json.hpp>
#include <filesystem>
#include <fstream>

namespace mxt {

namespace {
int64_t local_experts(const TrainConfig& c) { return c.model.num_local_experts / c.parallelism.ep_size; }

// A weight-gradient group of `requested` micro-batches as it takes effect: at most the step's.
int64_t capped_group(int64_t requested, const TrainConfig& cfg) {
  return std::max<int64_t>(1, std::min(requested, cfg.grad_acc_steps));
}

// Expert weight-gradient groups; 1 for the MXFP8 experts on the FP8 kernels (hopper_gemm=fp8: their own
// weight-gradient kernels).
int64_t expert_wgrad_group(const TrainConfig& cfg) {
  return cfg.fp8.fp8_kernels() ? 1 : capped_group(cfg.expert_wgrad_micro_batches, cfg);
}

int64_t lm_head_wgrad_group(const TrainConfig& cfg) { return capped_group(cfg.lm_head_wgrad_micro_batches, cfg); }

DType moments_dtype(const TrainConfig& cfg) {
  return cfg.adamw_moments_dtype == "bfloat16" ? DType::BF16 : DType::F32;
}

DType expert_grad_dtype(const TrainConfig& cfg) {
  return cfg.expert_grad_dtype == "bfloat16" ? DType::BF16 : DType::F32;
}

std::shared_ptr<ProcessGroups> checked_groups(const TrainConfig& c, std::shared_ptr<ProcessGroups> g) {
  if (!g) g = make_single_process_groups();
  const RankLayout& L = g->layout;
  if (c.parallelism.dp_size != L.dp_size || c.parallelism.ep_size != L.ep_size)
    throw ConfigError("parallelism.dp_size=" + std::to_string(c.parallelism.dp_size) + " x parallelism.ep_size=" +
                      std::to_string(c.parallelism.ep_size) + " does not match the process groups (dp " +
                      std::to_string(L.dp_size) + " x ep " + std::to_string(L.ep_size) + ")");
  return g;
}
}  // namespace

Trainer::Trainer(const TrainConfig& cfg, Ops& ops, Corpus tokens, std::shared_ptr<ProcessGroups> groups)
    : cfg_(cfg),
      ops_(ops),
      groups_(checked_groups(cfg, std::move(groups))),
      rank_(groups_->layout.world_rank),
      world_(groups_->layout.world_size),
      layout_(ParamLayout::build(cfg.model, groups_->layout.ep_rank * local_experts(cfg), local_experts(cfg))),
      loader_(std::move(tokens), cfg.dataset, cfg.seed, rank_, world_) {
  const int64_t T = cfg.dataset.micro_batch_size * cfg.dataset.max_seq_length;
  const DType F = DType::F32;
  const DType moments = moments_dtype(cfg);
  for (const auto& [on, key] : {std::pair{expert_grad_dtype(cfg) == DType::BF16, "expert_grad_dtype=bfloat16"},
                                {cfg.optimizer_store_param_remainders, "optimizer_store_param_remainders=true"},
                                {cfg.lm_head_grad_dtype == "bfloat16", "lm_head_grad_dtype=bfloat16"}})
    if (on && ops.act_dtype() != DType::BF16)
      throw ConfigError(std::string(key) + " needs the CUDA bf16 backend; this run's backend computes in " +
                        dtype_name(ops.act_dtype()) + " (backend=" + cfg.backend + ")");
  ops_.set_lm_head_chunk_tokens(cfg.lm_head_chunk_tokens);
  dense_shard_ = make_param_shard(groups_->world.get(), layout_.dense_numel);
  expert_shard_ = make_param_shard(groups_->dp.get(), layout_.expert_numel);
  // Over several ranks the dense fp32 master is sharded like its AdamW moments: each rank keeps the shard it
  // updates, and the working copy (padded, in the activation dtype; fp32 on the CPU backend) is all-gathered.
  dense_master_sharded_ = dense_shard_.comm != nullptr;
  // A bf16 LM-head gradient lives in head_grad_, and the fp32 dense gradient stops where the head begins: that
  // needs one rank and the head last among the dense parameters.
  int64_t dense_grad_numel = dense_shard_.padded;
  if (cfg.lm_head_grad_dtype == "bfloat16") {
    const ParamInfo& head = layout_.find("lm_head.weight");
    if (dense_shard_.comm != nullptr || head.offset + head.numel != dense_shard_.padded)
      throw std::logic_error("a bf16 LM-head gradient must end the unsharded dense gradient");
    dense_grad_numel = head.offset;
  }
  for (auto* fp : {&dense_, &expert_}) {
    const ParamShard& sh = fp == &dense_ ? dense_shard_ : expert_shard_;
    const std::string p = fp == &dense_ ? "dense." : "expert.";
    const bool sharded = fp == &dense_ && dense_master_sharded_;
    const bool working = fp == &dense_ ? ops.act_dtype() != F : has_expert_working_copy(cfg.fp8, ops.act_dtype());
    // A role without replicas keeps its master split into the bf16 working copy and a remainder.
    const bool split = cfg.optimizer_store_param_remainders && working && sh.comm == nullptr;
    if (split)
      state_.add(fp->rem, p + "master_remainder", DType::I16, {sh.numel});
    else
      state_.add(fp->master, p + "master", F, {sharded ? sh.shard : sh.padded});
    state_.add(fp->grad, p + "grad", fp == &dense_ ? F : expert_grad_dtype(cfg),
               {fp == &dense_ ? dense_grad_numel : sh.padded});
    state_.add(fp->adam_m, p + "adam_m", moments, {sh.shard});
    state_.add(fp->adam_v, p + "adam_v", moments, {sh.shard});
    fp->shard_offset = sh.offset;
    if (sharded) {
      state_.add(fp->working, p + "working", ops.act_dtype(), {sh.padded});
      continue;
    }
    if (working) state_.add(fp->working, p + "working", ops.act_dtype(), {sh.numel});
  }
  state_.add(mb_.ids, "batch.ids", DType::I32, {T});
  state_.add(mb_.labels, "batch.labels", DType::I32, {T});
  state_.add(mb_.pos, "batch.pos", DType::I32, {T});
  if (cfg.dataset.sequence_packing) state_.add(mb_.doc_ids, "batch.doc_ids", DType::I32, {T});
  if (cfg.lm_head_grad_dtype == "bfloat16")
    state_.add(head_grad_, "dense.lm_head_grad", DType::BF16, {layout_.find("lm_head.weight").numel});
  state_.add(loss_slots_, "loss_slots", F, {cfg.grad_acc_steps});
  state_.add(val_loss_, "val_loss", F, {1});
  state_.add(norm_acc_, "grad_norm_sq", F, {1});
  state_.finalize(ops_);
  if (ops.act_dtype() == F) {
    if (!dense_master_sharded_) dense_.working = dense_.master;
    expert_.working = expert_.master;
  }
  // else without an expert working copy (MXFP8 on bf16) expert_.working stays empty: the model reads the
  // master (expert_weights()), from which it quantises its MXFP8 expert copies.

  // Set-up can take minutes at full scale (billions of values drawn, tens of GB moved): say where it went.
  using clock = std::chrono::steady_clock;
  auto secs = [](clock::time_point t0) { return std::chrono::duration<double>(clock::now() - t0).count(); };
  auto t0 = clock::now();
  // Drawn weights go to buffers that are never zero-filled first, so the drawing threads touch their own pages.
  std::unique_ptr<float[]> drawn_dense, drawn_expert;
  std::vector<float> read_dense, read_expert;
  const float *dense, *expert;
  std::string weights_from = cfg.init_from_pretrained.empty() ? "initialised" : "read";
  if (cfg.init_from_pretrained.empty()) {
    drawn_dense.reset(new float[layout_.dense_numel]);
    drawn_expert.reset(new float[layout_.expert_numel]);
    const char* cache = std::getenv("MXTRAIN_INIT_CACHE");  // opt-in (benchmarks): mxtrain/init_cache.hpp
    if (cache != nullptr && *cache != 0) {
      const InitCacheOutcome o =
          init_params_cached(cache, layout_, cfg.model, cfg.seed, drawn_dense.get(), drawn_expert.get());
      if (!o.problem.empty()) spdlog::warn("MXTRAIN_INIT_CACHE: {}", o.problem);
      if (o.how == InitCacheOutcome::kRead) weights_from = "read from the init cache";
      if (rank_ == 0 && o.how != InitCacheOutcome::kNotWritten)
        spdlog::info("MXTRAIN_INIT_CACHE: {} {}", o.how == InitCacheOutcome::kRead ? "read from" : "written to",
                     o.path);
    } else {
      init_params_host(layout_, cfg.model, cfg.seed, drawn_dense.get(), drawn_expert.get());
    }
    dense = drawn_dense.get();
    expert = drawn_expert.get();
  } else {
    import_hf_weights(cfg.init_from_pretrained, layout_, cfg.model, read_dense, read_expert);
    if (rank_ == 0) spdlog::info("weights from {}", cfg.init_from_pretrained);
    dense = read_dense.data();
    expert = read_expert.data();
  }
  const double init_s = secs(t0);
  t0 = clock::now();
  const size_t dense_n = static_cast<size_t>(layout_.dense_numel), expert_n = static_cast<size_t>(layout_.expert_numel);
  if (dense_master_sharded_) {  // this rank's shard (its part past dense_numel is padding, left zero)
    const int64_t n = std::clamp<int64_t>(layout_.dense_numel - dense_shard_.offset, 0, dense_shard_.shard);
    ops_.upload(dense_.master.data, dense + dense_shard_.offset, static_cast<size_t>(n) * sizeof(float));
  } else {
    upload_master(dense_, dense, static_cast<int64_t>(dense_n));
  }
  upload_master(expert_, expert, static_cast<int64_t>(expert_n));
  refresh_working_weights();  // with a sharded dense master: the working copy all-gathered from the shards
  ops_.synchronize();
  const double upload_s = secs(t0);
  const double upload_gb = static_cast<double>(dense_n + expert_n) * sizeof(float) / 1e9;
  t0 = clock::now();

  const ExpertParallel ep{groups_->ep.get(), groups_->ep_host.get(), groups_->layout.ep_rank,
                          groups_->layout.ep_size, cfg.parallelism.ep_capacity_factor,
                          cfg.parallelism.ep_overlap};
  model_ = std::make_unique<MixtralModel>(cfg.model, ops_, cfg.dataset.micro_batch_size,
                                          cfg.dataset.max_seq_length, layout_, true, ep, cfg.fp8,
                                          cfg.recompute_experts, expert_wgrad_group(cfg), lm_head_wgrad_group(cfg));
  model_->bind(dense_.working, expert_weights(), dense_.grad, expert_.grad, head_grad_);
  // One replica of each expert: its gradient is final where its GEMM stores it, so the GEMM's epilogue adds its
  // sum of squares to the clipping norm instead of a second pass over the expert gradients (0.6% of the 8x7B
  // step; docs/perf.md, session 33).
  // MXTRAIN_EXPERT_NORM=separate keeps the separate pass (A/B runs).
  const std::string norm_env = std::getenv("MXTRAIN_EXPERT_NORM") ? std::getenv("MXTRAIN_EXPERT_NORM") : "";
  if (!norm_env.empty() && norm_env != "wgrad" && norm_env != "separate")
    throw std::invalid_argument("MXTRAIN_EXPERT_NORM must be wgrad or separate, got '" + norm_env + "'");
  expert_norm_in_wgrad_ = ops_.sums_wgrad_norm() && norm_env != "separate" && !expert_shard_.comm &&
                          model_->can_add_expert_grad_norm(cfg.grad_acc_steps);
  if (expert_norm_in_wgrad_) model_->set_expert_grad_norm(norm_acc_);
  for (int64_t l = 0; l < cfg.model.num_hidden_layers; ++l)
    for (int64_t e = 0; e < cfg.model.num_local_experts; ++e) expert_origin_.push_back(static_cast<int32_t>(e));
  if (!cfg.checkpoint.ckpt_dir.empty())
    ckpt_ = std::make_unique<Checkpointer>(cfg, world_ > 1 ? make_mpi_ckpt_comm() : nullptr);
  if (rank_ == 0 && usable_cpus() == 1 && machine_cpus() > 1)
    spdlog::warn("this rank may run on 1 of the machine's {} CPUs (mpirun binds each rank to a core by default): "
                 "the set-up and background checkpoint writes are serialised; give ranks more cores (mpirun "
                 "--bind-to none, or --map-by slot:PE=N)", machine_cpus());
  if (rank_ == 0 && cfg.model.router_force_load_balancing)
    spdlog::warn("router_force_load_balancing=true (benchmarking only): every token goes to a fixed round-robin of "
                 "experts, not to the router's choice; the model does not learn to route");
  if (rank_ == 0 && cfg.parallelism.ep_rebalance_interval > 0) {
    if (cfg.parallelism.ep_size > 1 && cfg.parallelism.ep_size == cfg.model.num_local_experts)
      spdlog::warn("parallelism.ep_rebalance_interval={} has no effect with one expert per EP rank (a rank's load is "
                   "its expert's wherever that expert goes)", cfg.parallelism.ep_rebalance_interval);
    else if (cfg.parallelism.ep_size > 1)
      spdlog::info("parallelism.ep_rebalance_interval={}: every {} steps each layer's experts may be re-placed over the "
                   "{} EP ranks (relabelled; the final export lists them in their new order)",
                   cfg.parallelism.ep_rebalance_interval, cfg.parallelism.ep_rebalance_interval, cfg.parallelism.ep_size);
    else
      spdlog::warn("parallelism.ep_rebalance_interval={} has no effect with parallelism.ep_size=1 (one EP rank holds "
                   "every expert)", cfg.parallelism.ep_rebalance_interval);
  }
  if (rank_ == 0 && cfg.expert_wgrad_micro_batches > expert_wgrad_group(cfg))
    spdlog::warn("expert_wgrad_micro_batches={} takes effect as {}: {}", cfg.expert_wgrad_micro_batches,
                 expert_wgrad_group(cfg),
                 cfg.fp8.fp8_kernels()
                     ? "the MXFP8 experts on the FP8 kernels (hopper_gemm=fp8) have their own weight-gradient kernels"
                                 : "a group cannot hold more than the step's grad_acc_steps micro-batches");
  if (rank_ == 0 && cfg.lm_head_wgrad_micro_batches > lm_head_wgrad_group(cfg))
    spdlog::warn("lm_head_wgrad_micro_batches={} takes effect as {}: a group cannot hold more than the step's "
                 "grad_acc_steps micro-batches", cfg.lm_head_wgrad_micro_batches, lm_head_wgrad_group(cfg));
  if (rank_ == 0)
    spdlog::info("set-up: weights {} in {:.1f} s, {:.1f} GB to the {} in {:.1f} s (with the working copies), model "
                 "buffers in {:.1f} s", weights_from, init_s, upload_gb,
                 ops_.name(), upload_s, secs(t0));
}

Trainer::~Trainer() {
  for (MicroGraph& g : graphs_) ops_.graph_destroy(g.exec);
}

// Graph replay needs a forward + backward that never waits for the host: one process (no exchanges, no
// gradient hooks), no aux loss (its coefficients are computed on the host), no jitter (host-drawn noise), and
// no per-stage timing (its events are read per stage).
bool Trainer::graphs_usable() const {
  return cfg_.cuda_graphs && ops_.graphs_supported() && world_ == 1 && cfg_.model.router_aux_loss_coef == 0 &&
         cfg_.model.router_jitter_noise == 0 && stage_clock() == nullptr;
}

double Trainer::forward_backward_graphed(int64_t i, float ce_scale, float aux_scale, uint64_t jitter_seed) {
  const Tensor slot = loss_slots_.rows(i, 1);
  if (!graphs_on_) return model_->forward_backward(mb_, ce_scale, aux_scale, slot, true, jitter_seed);
  MicroGraph& g = graphs_[static_cast<size_t>(i)];
  // The scale is a kernel argument inside the graph, and a graph captured while the MXFP8 weight copies were fresh
  // (after an evaluation's forward quantised them) holds no quantisation for the steps that need one.
  if (g.exec && (g.ce_scale != ce_scale || g.quantizes != model_->fp8_weights_stale())) {
    ops_.graph_destroy(g.exec);
    g.exec = nullptr;
  }
  if (!g.exec) {
    const bool quantizes = model_->fp8_weights_stale();
    std::string why;
    ops_.capture_begin();
    try {
      model_->forward_backward(mb_, ce_scale, aux_scale, slot, true, jitter_seed);
    } catch (const std::exception& e) {
      why = e.what();
    }
    void* exec = ops_.capture_end(why.empty() ? &why : nullptr);
    if (!exec || !why.empty()) {
      ops_.graph_destroy(exec);
      graphs_on_ = false;
      spdlog::warn("cuda_graphs: capturing micro-batch {} failed ({}); running eagerly from here on", i, why);
      if (quantizes) model_->invalidate_fp8_weights();  // the capture recorded, not ran, the quantisation
      return model_->forward_backward(mb_, ce_scale, aux_scale, slot, true, jitter_seed);
    }
    g = {exec, ce_scale, quantizes};
  }
  ops_.graph_launch(g.exec);
  if (g.quantizes) model_->fp8_weights_refreshed();
  return 0.0;  // no aux loss with graphs
}

TrainState Trainer::ckpt_state() {
  TrainState s{ops_, layout_, dense_, expert_, step_, loader_, world_, groups_->layout.dp_rank,
               groups_->layout.dp_size, {}, {}};
  if (dense_shard_.comm) s.dense_moments = {dense_shard_.offset, dense_shard_.shard, dense_master_sharded_};  // ZeRO
  if (expert_shard_.comm) s.expert_moments = {expert_shard_.offset, expert_shard_.shard};
  return s;
}

void Trainer::refresh_working_weights(bool dense_written, bool expert_written) {
  // (no expert working copy with MXFP8 on bf16, none apart from the master on F32: nothing to copy)
  auto copy_whole = [&](FlatParams& fp) {  // (a split master's working copy is its own upper half)
    if (fp.working.data && !fp.split() && fp.working.data != fp.master.data)
      ops_.copy(fp.master.rows(0, fp.working.numel()), fp.working);
  };
  if (dense_master_sharded_) {  // this rank's updated shard, then everyone's
    if (!dense_written) ops_.copy(dense_.master, dense_.working.rows(dense_shard_.offset, dense_shard_.shard));
    all_gather_params(dense_shard_, dense_.working);
  } else if (!dense_written) {
    copy_whole(dense_);
  }
  if (!expert_written) copy_whole(expert_);
  if (model_) model_->invalidate_fp8_weights();  // MXFP8 copies are re-quantised by the next forward
}

Tensor Trainer::fused_working(const FlatParams& fp, const ParamShard& shard, bool sharded_master) const {
  if (!fp.working.data || fp.working.data == fp.master.data) return Tensor();
  if (sharded_master) return fp.working.rows(shard.offset, shard.shard);
  // Without replicas this rank's shard is the whole (padded) master, whose first working.numel() elements the
  // working copy mirrors; with replicas the other shards arrive in the fp32 master, so the copy stays separate.
  if (shard.comm == nullptr) return fp.working;
  return Tensor();
}

void Trainer::load_batch(BatchLoader& from) {
  from.next(batch_);
  const size_t bytes = batch_.input_ids.size() * sizeof(int32_t);
  // In stream order after the previous micro-batch's kernels, which read the same buffers.
  ops_.upload_async(mb_.ids.data, batch_.input_ids.data(), bytes);
  ops_.upload_async(mb_.labels.data, batch_.labels.data(), bytes);
  ops_.upload_async(mb_.pos.data, batch_.positions.data(), bytes);
  if (mb_.doc_ids.data) ops_.upload_async(mb_.doc_ids.data, batch_.doc_ids.data(), bytes);  // packed rows
  n_valid_ = std::count_if(batch_.labels.begin(), batch_.labels.end(), [](int32_t x) { return x >= 0; });
}

// parallelism.overlap_grad_reduce: the ranges of the flat gradient buffers whose gradients the backward has just
// finished (see MixtralModel::set_grads_done_hook), summed to their shard owners while the backward goes on.
// part: num_hidden_layers = the head (final norm, LM head, and the dense padding), l = layer l (its dense weights;
// its experts, and after the last layer the expert padding), -1 = the embedding. Together they cover both
// buffers once, so the result is reduce_scatter_grads'.
void Trainer::start_grad_reduce(int part) {
  const int64_t L = cfg_.model.num_hidden_layers;
  if (grad_parts_.empty()) {  // once: [dense begin, end, expert begin, end) per part, indexed part + 1
    auto first = [&](const std::string& name) { return layout_.find(name).offset; };
    auto end = [&](const std::string& name) {
      const ParamInfo& p = layout_.find(name);
      return p.offset + p.numel;
    };
    grad_parts_.push_back({0, first("model.layers.0.input_layernorm.weight"), 0, 0});
    for (int64_t l = 0; l < L; ++l) {
      const std::string layer = "model.layers." + std::to_string(l) + ".";
      grad_parts_.push_back({first(layer + "input_layernorm.weight"), end(layer + "block_sparse_moe.gate.weight"),
                             first(layer + "block_sparse_moe.experts.w13"),
                             l == L - 1 ? expert_shard_.padded : end(layer + "block_sparse_moe.experts.w2")});
    }
    grad_parts_.push_back({first("model.norm.weight"), dense_shard_.padded, 0, 0});
  }
  const std::array<int64_t, 4>& r = grad_parts_.at(static_cast<size_t>(part + 1));
  start_reduce_grad_range(dense_shard_, dense_.grad, r[0], r[1]);
  start_reduce_grad_range(expert_shard_, expert_.grad, r[2], r[3]);
}

StepResult Trainer::train_step() {
  const int64_t acc = cfg_.grad_acc_steps;
  if (graphs_warm_ && graphs_.empty() && graphs_usable()) {  // after one eager step: scratch sized, kernels loaded
    graphs_.resize(static_cast<size_t>(acc));
    graphs_on_ = true;
    if (rank_ == 0) spdlog::info("cuda_graphs: each micro-batch's forward + backward captured once, then replayed");
  }
  // The first weight-gradient GEMM of the step stores its sums where the model can (the bf16 experts; the LM
  // head with lm_head_wgrad_micro_batches > 1): no zeroing, no first read of those (the rest of their buffers, and
  // the sharding padding, is zeroed).
  // Zeroes buf but for the stored range [begin, end).
  auto zero_outside = [this](const Tensor& buf, int64_t begin, int64_t end) {
    if (begin > 0) ops_.zero(buf.rows(0, begin));
    if (buf.numel() > end) ops_.zero(buf.rows(end, buf.numel() - end));
  };
  if (model_->overwrites_lm_head_grad()) {
    const ParamInfo& head = layout_.find("lm_head.weight");
    zero_outside(dense_.grad, head.offset, head.offset + head.numel);
  } else {
    ops_.zero(dense_.grad);
  }
  if (model_->overwrites_expert_grads()) zero_outside(expert_.grad, 0, layout_.expert_numel);
  else ops_.zero(expert_.grad);
  ops_.zero(loss_slots_);
  ops_.zero(norm_acc_);  // the experts' weight-gradient GEMMs may add to it (expert_norm_in_wgrad_)
  model_->reset_expert_rows();  // ep_rebalance_interval decides by this step's routing alone
  std::vector<int64_t> n_valid(acc);
  double aux_sum = 0;
  // The step is one rank's view of acc x world micro-batches: micro-batch i of rank r is number i*world + r.
  const int64_t micro_total = acc * world_;
  for (int64_t i = 0; i < acc; ++i) {
    load_batch(loader_);
    n_valid[i] = n_valid_;
    // Each micro-batch's loss is a mean over its own tokens, and the step averages all ranks' micro-batches
    // (HF + recipe); the gradient reduction then sums over ranks.
    const float ce_scale = 1.f / static_cast<float>(std::max<int64_t>(1, n_valid[i]) * micro_total);
    const int64_t micro = (step_ * acc + i) * world_ + rank_;
    const uint64_t jitter_seed = cfg_.seed ^ (static_cast<uint64_t>(micro) * 0x9E3779B97F4A7C15ull);
    TraceScope trace("micro_batch " + std::to_string(i));
    const bool overlap = i == acc - 1 && cfg_.parallelism.overlap_grad_reduce;
    if (overlap) model_->set_grads_done_hook([this](int part) { start_grad_reduce(part); });
    model_->set_micro_batch(i, acc, true);
    aux_sum += forward_backward_graphed(i, ce_scale, 1.f / static_cast<float>(micro_total), jitter_seed);
    if (overlap) model_->set_grads_done_hook({});
  }
  StepResult r;
  std::vector<float> slots(acc);
  ops_.download(slots.data(), loss_slots_.data, acc * sizeof(float));
  // Over all ranks: summed micro-batch means, aux losses, and per stop signal the ranks that caught it (so that
  // all stop after the same step).
  const auto stops = stop_signals();
  double sums[2 + std::tuple_size_v<decltype(stops)>] = {0, aux_sum};
  for (int64_t i = 0; i < acc; ++i) sums[0] += slots[i] / std::max<int64_t>(1, n_valid[i]);
  for (size_t k = 0; k < stops.size(); ++k) sums[2 + k] = stop_signal() == stops[k] ? 1.0 : 0.0;
  groups_->world_host->all_reduce_sum(sums, 2 + static_cast<int64_t>(stops.size()), CommType::F64);
  for (size_t k = 0; k < stops.size(); ++k) {
    const int n = static_cast<int>(sums[2 + k]);
    if (n > 0 && (r.stop_ranks == 0 || n > r.stop_ranks)) r.stop_signal = stops[k];
    r.stop_ranks = std::max(r.stop_ranks, n);
  }
  r.loss = sums[0] / static_cast<double>(micro_total);
  r.aux_loss = sums[1] / static_cast<double>(micro_total);
  r.loss += cfg_.model.router_aux_loss_coef * r.aux_loss;

  TraceScope trace_opt("grad_reduce + optimizer");
  // Gradients: dense summed over the world, experts over their DP replicas; each rank keeps its shard.
  if (cfg_.parallelism.overlap_grad_reduce) {
    start_grad_reduce(-1);  // the embedding's; the rest was started during the backward
    for (const ParamShard* s : {&dense_shard_, &expert_shard_})
      if (s->comm) s->comm->wait_started();
  } else {
    reduce_scatter_grads(dense_shard_, dense_.grad);
    reduce_scatter_grads(expert_shard_, expert_.grad);
  }
  // With a bf16 LM-head gradient (one rank, no padding) the dense gradient is dense_.grad, which ends where the
  // head begins, and then head_grad_.
  const bool head_bf16 = head_grad_.data != nullptr;
  const Tensor dense_g = head_bf16 ? dense_.grad : dense_.grad.rows(dense_shard_.offset, dense_shard_.shard);
  const Tensor expert_g = expert_.grad.rows(expert_shard_.offset, expert_shard_.shard);
  // The shards are disjoint and together cover every dense element once and every expert once.
  ops_.sum_squares(dense_g, norm_acc_);
  if (head_bf16) ops_.sum_squares(head_grad_, norm_acc_);
  if (!expert_norm_in_wgrad_) ops_.sum_squares(expert_g, norm_acc_);
  float norm_sq = 0;
  ops_.download(&norm_sq, norm_acc_.data, sizeof(float));
  double norm_sq_all = norm_sq;
  groups_->world_host->all_reduce_sum(&norm_sq_all, 1, CommType::F64);
  r.grad_norm = std::sqrt(norm_sq_all);
  // torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6) when that is below 1.
  const double clip = std::min(1.0, cfg_.max_grad_norm / (r.grad_norm + 1e-6));
  r.lr = lr_at_step(cfg_.adamw, cfg_.lr_scheduler, step_);
  AdamWStep s;
  s.lr = static_cast<float>(r.lr);
  s.beta1 = static_cast<float>(cfg_.adamw.beta1);
  s.beta2 = static_cast<float>(cfg_.adamw.beta2);
  s.eps = static_cast<float>(cfg_.adamw.eps);
  s.weight_decay = static_cast<float>(cfg_.adamw.weight_decay);
  s.step = step_ + 1;
  s.grad_scale = static_cast<float>(clip);
  // Where it can, the step writes the bf16 working copy as it goes (one read of the fp32 master instead of two).
  const Tensor dense_w = fused_working(dense_, dense_shard_, dense_master_sharded_);
  const Tensor expert_w = fused_working(expert_, expert_shard_, false);
  const Tensor dense_master = dense_.split()             ? Tensor()
                              : dense_master_sharded_ ? dense_.master
                                                      : dense_.master.rows(dense_shard_.offset, dense_shard_.shard);
  // AdamW over [begin, begin + n) of the dense state with gradient g (the whole shard, or one of the two pieces).
  auto dense_adamw = [&](int64_t begin, int64_t n, const Tensor& g, bool whole) {
    const Tensor m = whole ? dense_.adam_m : dense_.adam_m.rows(begin, n);
    const Tensor v = whole ? dense_.adam_v : dense_.adam_v.rows(begin, n);
    if (dense_.split())
      ops_.adamw_step_split(whole ? dense_.working : dense_.working.rows(begin, n),
                            whole ? dense_.rem : dense_.rem.rows(begin, n), g, m, v, s);
    else
      ops_.adamw_step_to(whole ? dense_master : dense_master.rows(begin, n), g, m, v, s,
                         whole || dense_w.data == nullptr ? dense_w : dense_w.rows(begin, n));
  };
  if (head_bf16) {
    dense_adamw(0, dense_g.numel(), dense_g, false);
    dense_adamw(dense_g.numel(), head_grad_.numel(), head_grad_, false);
  } else {
    dense_adamw(0, dense_g.numel(), dense_g, true);
  }
  if (expert_.split()) {
    ops_.adamw_step_split(expert_.working, expert_.rem, expert_g, expert_.adam_m, expert_.adam_v, s);
  } else {
    ops_.adamw_step_to(expert_.master.rows(expert_shard_.offset, expert_shard_.shard), expert_g, expert_.adam_m,
                       expert_.adam_v, s, expert_w);
    all_gather_params(expert_shard_, expert_.master);
  }
  // the dense master's shards reach the other ranks through the working copy
  refresh_working_weights(dense_w.data != nullptr || dense_.split(), expert_w.data != nullptr || expert_.split());
  ++step_;
  graphs_warm_ = true;
  const int64_t every = cfg_.parallelism.ep_rebalance_interval;
  if (every > 0 && groups_->layout.ep_size > 1 && step_ % every == 0) rebalance_experts();
  return r;
}

std::vector<double> Trainer::run() {
  std::vector<double> losses;
  const bool resumed = ckpt_ && ckpt_->resume(ckpt_state()) >= 0;
  if (resumed) refresh_working_weights();
  const int64_t total = cfg_.num_train_steps;
  const int64_t tokens_per_step =
      cfg_.grad_acc_steps * cfg_.dataset.micro_batch_size * cfg_.dataset.max_seq_length * world_;
  const double flops_per_token = model_flops_per_token(cfg_.model, cfg_.dataset.max_seq_length);
  std::unique_ptr<MetricsLog> log, val_log;
  if (rank_ == 0) {
    const std::string path =
        cfg_.logger.metrics_file.empty() ? cfg_.output_dir + "/metrics.jsonl" : cfg_.logger.metrics_file;
    auto open_log = [&](const std::string& p) {
      if (resumed) truncate_metrics_after(p, step_);  // then append: one line per step across restarts
      return std::make_unique<MetricsLog>(p, resumed);
    };
    log = open_log(path);
    if (val_loader_ && cfg_.validation.every_n_steps > 0)
      val_log = open_log(cfg_.validation.metrics_file.empty() ? cfg_.output_dir + "/validation.jsonl"
                                                              : cfg_.validation.metrics_file);
    spdlog::info("training {} steps on {} | {} tokens per step | metrics -> {}", total, ops_.name(),
                 tokens_per_step, path);
  }
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  auto t_last = t0;
  int64_t step_last = step_;
  const int64_t first = step_;
  while (step_ < total) {
    const StepResult r = train_step();
    losses.push_back(r.loss);
    if (step_ == first + 1 && total > step_) {  // steady state only: the first step sets up NCCL, cuBLASLt, caches
      reset_ep_exchange_stats();
      if (StageClock* c = stage_clock()) c->reset();
    }
    if (!std::isfinite(r.loss)) throw std::runtime_error("loss is not finite at step " + std::to_string(step_));
    if (log && (step_ % cfg_.logger.frequency == 0 || step_ == total)) {
      const auto now = clock::now();
      const double elapsed = std::chrono::duration<double>(now - t0).count();
      const double interval = std::chrono::duration<double>(now - t_last).count();
      StepMetrics m;
      m.step = step_;
      m.total_steps = total;
      m.loss = r.loss;
      m.aux_loss = r.aux_loss;
      m.lr = r.lr;
      m.grad_norm = r.grad_norm;
      m.tokens = step_ * tokens_per_step;
      m.tokens_per_s = interval > 0 ? static_cast<double>((step_ - step_last) * tokens_per_step) / interval : 0;
      m.flops_per_s_per_rank = m.tokens_per_s / world_ * flops_per_token;
      m.elapsed_s = elapsed;
      m.eta_s = elapsed / static_cast<double>(step_ - first) * static_cast<double>(total - step_);
      log->log(m);
      if (step_ == first + 1 || step_ == total) log_device_memory();
      t_last = now;
      step_last = step_;
    }
    if (ckpt_) ckpt_->after_step(ckpt_state());
    const int64_t every = cfg_.validation.every_n_steps;
    if (val_loader_ && every > 0 && (step_ % every == 0 || step_ == total)) {
      const ValidationResult v = evaluate();
      if (val_log) val_log->log(ValidationMetrics{step_, v.loss, v.tokens, v.seconds});
    }
    if (r.stop_ranks > 0 && step_ < total) {
      stop_early(r.stop_signal, r.stop_ranks);
      break;
    }
  }
  if (cfg_.parallelism.ep_size > 1) log_ep_exchange_stats(*groups_->world_host);
  if (StageClock* c = stage_clock()) {
    ops_.synchronize();
    c->log("world rank " + std::to_string(rank_), static_cast<int>(std::max<int64_t>(1, step_ - first - 1)));
  }
  if (ckpt_) ckpt_->finish();
  if (stopped_early_) {
    if (rank_ == 0)
      spdlog::warn("stopped at step {} of {}{}: run the same command to resume", step_, total,
                   ckpt_ ? " (checkpoint saved)" : "; checkpoint.ckpt_dir is not set, so nothing was saved");
    return losses;  // no final model: training did not finish
  }
  if (cfg_.checkpoint.save_final_model && !cfg_.checkpoint.ckpt_dir.empty()) {
    const std::string dir = cfg_.checkpoint.ckpt_dir + "/final_model";
    export_final_model(dir);  // collective under expert parallelism; rank 0 writes
    if (rank_ == 0) spdlog::info("final model (HF safetensors, {}) -> {}", cfg_.checkpoint.final_model_dtype, dir);
  }
  return losses;
}

void Trainer::set_validation_data(Corpus corpus) {
  val_loader_ = std::make_unique<BatchLoader>(std::move(corpus), validation_dataset(cfg_), cfg_.seed, rank_, world_);
  const int64_t want = cfg_.validation.num_batches * cfg_.dataset.micro_batch_size;
  if (rank_ == 0 && want > val_loader_->windows_per_epoch())
    spdlog::warn("validation.num_batches={} reads {} rows per rank, but validation.paths holds {} per rank: some are "
                 "evaluated more than once", cfg_.validation.num_batches, want, val_loader_->windows_per_epoch());
}

ValidationResult Trainer::evaluate() {
  if (!val_loader_) throw std::logic_error("Trainer::evaluate without set_validation_data");
  const auto t0 = std::chrono::steady_clock::now();
  TraceScope trace("validation");
  val_loader_->set_position(0, 0, 0);  // the same micro-batches every time
  ops_.zero(val_loss_);
  int64_t tokens = 0;
  for (int64_t i = 0; i < cfg_.validation.num_batches; ++i) {
    load_batch(*val_loader_);
    tokens += n_valid_;
    model_->forward_backward(mb_, 1.f, 0.f, val_loss_, false, 0);  // no gradients, no router jitter
  }
  float sum = 0;
  ops_.download(&sum, val_loss_.data, sizeof(float));
  // The forward-only pass may have grown an op's scratch buffer, which captured graphs would still point at:
  // capture again at the next step (a capture costs about one eager micro-batch's launches).
  for (MicroGraph& g : graphs_) {
    ops_.graph_destroy(g.exec);
    g.exec = nullptr;
  }
  model_->invalidate_fp8_weights();  // so the first micro-batch's new graph holds the quantisation again
  double sums[2] = {sum, static_cast<double>(tokens)};
  groups_->world_host->all_reduce_sum(sums, 2, CommType::F64);
  ValidationResult r;
  r.tokens = static_cast<int64_t>(sums[1]);
  r.loss = r.tokens > 0 ? sums[0] / sums[1] : std::nan("");
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

// Every rank gets here after the same step (the stop count comes from the step's loss reduction), so the save
// below is collective as usual.
void Trainer::stop_early(int sig, int stop_ranks) {
  stopped_early_ = true;
  if (rank_ == 0) {
    spdlog::warn("{} on {} of {} rank(s): stopping after step {}{}", stop_signal_name(sig), stop_ranks, world_,
                 step_, ckpt_ ? ", saving a checkpoint first" : "");
  }
  if (ckpt_) ckpt_->save(ckpt_state());  // nothing to do where after_step has just saved this step
}

void Trainer::log_device_memory() {
  const size_t peak = ops_.peak_allocated();
  if (peak == 0) return;
  const MemoryPlan plan = plan_memory(cfg_, ops_);
  const double planned = static_cast<double>(plan.total_bytes());
  spdlog::info("device memory: peak allocated {:.3f} GiB, plan {:.3f} GiB ({:+.1f}%)", peak / 1073741824.0,
               planned / 1073741824.0, 100.0 * (static_cast<double>(peak) / planned - 1.0));
}

void Trainer::master_weights(std::vector<float>& dense, std::vector<float>& expert) {
  dense.resize(layout_.dense_numel);
  expert.resize(layout_.expert_numel);
  if (dense_master_sharded_) {  // collective: the shards gathered into a temporary full buffer
    const ParamShard& sh = dense_shard_;
    const Tensor full(ops_.alloc(static_cast<size_t>(sh.padded) * sizeof(float)), DType::F32, {sh.padded},
                      ops_.device());
    ops_.copy(dense_.master, full.rows(sh.offset, sh.shard));
    all_gather_params(sh, full);
    ops_.download(dense.data(), full.data, dense.size() * sizeof(float));
    ops_.release(full.data);
  } else {
    download_master(dense_, dense.data(), layout_.dense_numel);
  }
  download_master(expert_, expert.data(), layout_.expert_numel);
}

// A role's fp32 master to or from the host; a split one (optimizer_store_param_remainders) through
// mxtrain/master_transfer.hpp.
void Trainer::upload_master(FlatParams& fp, const float* host, int64_t n) {
  if (!fp.split()) return ops_.upload(fp.master.data, host, static_cast<size_t>(n) * sizeof(float));
  upload_split(ops_, fp.working.data, fp.rem.data, 0, n, host);
}

void Trainer::download_master(const FlatParams& fp, float* host, int64_t n) {
  if (!fp.split()) return ops_.download(host, fp.master.data, static_cast<size_t>(n) * sizeof(float));
  download_joined(ops_, fp.working.data, fp.rem.data, 0, n, host);
}

void Trainer::export_final_model(const std::string& dir) {
  std::vector<float> dense, expert;
  master_weights(dense, expert);  // collective over every rank (the dense master is sharded)
  if (groups_->layout.dp_rank != 0) return;  // DP replicas hold the same weights as the first EP group
  ParamLayout layout = layout_;
  if (groups_->layout.ep_size > 1) {  // each EP rank holds a slice of the experts: collect them on rank 0
    std::vector<float> all;
    gather_all_experts(layout_, cfg_.model, *groups_->ep_host, expert, layout, all);
    expert.swap(all);
  }
  if (rank_ != 0) return;
  export_hf_weights(dir, layout, cfg_.model, dense, expert,
                    cfg_.checkpoint.final_model_dtype == "bfloat16" ? DType::BF16 : DType::F32);
}

void Trainer::dump_first_batch(const std::string& dir) {
  namespace fs = std::filesystem;
  if (world_ > 1) throw ConfigError("--dump runs on one rank (parallelism.ep_size=1, parallelism.dp_size=1)");
  fs::create_directories(dir);
  ops_.zero(dense_.grad);
  if (head_grad_.data != nullptr) ops_.zero(head_grad_);
  ops_.zero(expert_.grad);
  ops_.zero(loss_slots_);
  model_->set_micro_batch(0, 1, expert_.grad.dtype == DType::BF16);  // a bf16 expert gradient is stored, not added to
  load_batch(loader_);
  const float ce_scale = 1.f / static_cast<float>(std::max<int64_t>(1, n_valid_));
  const double aux = model_->forward_backward(mb_, ce_scale, 1.f, loss_slots_.rows(0, 1), true, cfg_.seed);
  float loss_sum = 0;
  ops_.download(&loss_sum, loss_slots_.data, sizeof(float));
  const double ce = loss_sum / static_cast<double>(std::max<int64_t>(1, n_valid_));

  std::vector<float> gd(layout_.dense_numel), ge(layout_.expert_numel);
  ops_.download(gd.data(), dense_.grad.data, static_cast<size_t>(dense_.grad.numel()) * sizeof(float));
  if (head_grad_.data != nullptr) {
    const ParamInfo& head = layout_.find("lm_head.weight");
    download_f32(ops_, head_grad_, 0, head.numel, gd.data() + head.offset);
  }
  download_f32(ops_, expert_.grad, 0, layout_.expert_numel, ge.data());
  export_hf_weights(dir + "/grads", layout_, cfg_.model, gd, ge, DType::F32);

  // Logits of the same batch from the saved final hidden state (outside the step: allocation is fine here).
  const Tensor& h = model_->final_hidden();
  const int64_t T = h.dim(0), V = cfg_.model.vocab_size;
  const ModelTensors w = bind_tensors(layout_, cfg_.model, dense_.working, expert_weights());  // lm_head only
  Tensor logits(ops_.alloc(static_cast<size_t>(T * V) * sizeof(float)), DType::F32, {T, V}, ops_.device());
  ops_.gemm(false, true, T, V, cfg_.model.hidden_size, 1.f, h, w.lm_head, 0.f, logits);
  std::vector<float> host(static_cast<size_t>(T * V));
  ops_.download(host.data(), logits.data, host.size() * sizeof(float));
  ops_.release(logits.data);
  write_safetensors(dir + "/logits.safetensors", {{"logits", {T, V}, host.data()}}, DType::F32);

  nlohmann::json j;
  j["loss"] = ce + cfg_.model.router_aux_loss_coef * aux;
  j["ce_loss"] = ce;
  j["aux_loss"] = aux;
  j["tokens"] = n_valid_;
  j["input_ids"] = batch_.input_ids;
  j["backend"] = ops_.name();
  // The experts each token was routed to, per layer (parity checks compare gradients under the same routing).
  nlohmann::json topk = nlohmann::json::array();
  for (int l = 0; l < cfg_.model.num_hidden_layers; ++l) {
    const Tensor& idx = model_->topk_indices(l);
    std::vector<int32_t> v(static_cast<size_t>(idx.numel()));
    ops_.download(v.data(), idx.data, v.size() * sizeof(int32_t));
    topk.push_back(v);
  }
  j["topk"] = topk;
  write_file_atomic(dir + "/loss.json", j.dump(2) + "\n");
}

bool has_expert_working_copy(const Fp8Config& fp8, DType act_dtype) {
  return act_dtype != DType::F32 && !fp8.enabled;
}

namespace {
// Stands in for a backend while a model is only planned (allocate=false): the plan reads nothing of the
// backend but its activation dtype. Anything that would allocate fails.
class PlanningOps : public CpuOps {
 public:
  explicit PlanningOps(DType act) : act_(act) {}
  DType act_dtype() const override { return act_; }
  void* alloc(size_t) override { throw std::logic_error("PlanningOps: a memory plan allocates nothing"); }

 private:
  DType act_;
};
}  // namespace

MemoryPlan plan_memory(const TrainConfig& cfg, Ops& ops) { return plan_memory(cfg, ops.act_dtype()); }

MemoryPlan plan_memory(const TrainConfig& cfg, DType act_dtype) {
  MemoryPlan p;
  const ParamLayout layout = ParamLayout::build(cfg.model, 0, local_experts(cfg));
  p.dense_params = layout.dense_numel;
  p.expert_params = layout.expert_numel;
  // fp32 master + gradient (padded to the replica count) + two AdamW moments of this rank's ZeRO-1 shard,
  // + the working copy in the activation dtype where the trainer keeps one (as its constructor decides).
  const size_t act = dtype_size(act_dtype);
  const size_t dense_working = act_dtype == DType::F32 ? 0 : act;
  const size_t expert_working = has_expert_working_copy(cfg.fp8, act_dtype) ? act : 0;
  const size_t moment = dtype_size(moments_dtype(cfg));
  // (optimizer_store_param_remainders: a master without replicas is a 2-byte remainder beside its working copy)
  auto bytes = [&](int64_t n, int64_t replicas, size_t working, size_t grad = sizeof(float)) {
    const int64_t shard = (n + replicas - 1) / replicas;
    const size_t master = cfg.optimizer_store_param_remainders && replicas == 1 && working ? 2 : sizeof(float);
    return static_cast<size_t>(shard * replicas) * (master + grad) + static_cast<size_t>(shard) * 2 * moment +
           static_cast<size_t>(n) * working;
  };
  const int64_t world = cfg.parallelism.dp_size * cfg.parallelism.ep_size;
  // Over several ranks the dense master is this rank's shard only and the working copy is padded, in the
  // activation dtype even on an F32 backend (Trainer: dense_master_sharded_).
  auto dense_bytes = [&](int64_t n) {
    if (world == 1) return bytes(n, 1, dense_working);
    const int64_t shard = (n + world - 1) / world;
    return static_cast<size_t>(shard * world) * (sizeof(float) + act) + static_cast<size_t>(shard) * (sizeof(float) + 2 * moment);
  };
  p.param_bytes = dense_bytes(layout.dense_numel) + bytes(layout.expert_numel, cfg.parallelism.dp_size, expert_working,
                                                          dtype_size(expert_grad_dtype(cfg)));
  if (cfg.lm_head_grad_dtype == "bfloat16")  // in bf16 instead of in the dense fp32 gradient
    p.param_bytes -= static_cast<size_t>(cfg.model.vocab_size * cfg.model.hidden_size) * 2;
  p.expert_working_bytes = static_cast<size_t>(layout.expert_numel) * expert_working;
  p.act_dtype = act_dtype;
  const ExpertParallel ep{nullptr, nullptr, 0, static_cast<int>(cfg.parallelism.ep_size),
                          cfg.parallelism.ep_capacity_factor, cfg.parallelism.ep_overlap};
  PlanningOps ops(act_dtype);
  MixtralModel planned(cfg.model, ops, cfg.dataset.micro_batch_size, cfg.dataset.max_seq_length, layout, false, ep,
                       cfg.fp8, cfg.recompute_experts, expert_wgrad_group(cfg), lm_head_wgrad_group(cfg));
  p.activation_bytes = planned.arena().total_bytes();
  p.fp8_weight_bytes = planned.mx_weight_arena().total_bytes();
  // The LM-head loss's logits chunk (the backend's activation dtype) and its per-token losses. With held logit
  // gradients (lm_head_wgrad_micro_batches > 1) the step makes its logits in them, and only an evaluation's
  // forward needs the chunk.
  const int64_t T = cfg.dataset.micro_batch_size * cfg.dataset.max_seq_length;
  const bool chunk_used = lm_head_wgrad_group(cfg) == 1 || cfg.validation.every_n_steps > 0;
  p.lm_head_rows = chunk_used ? lm_head_chunk_rows(T, cfg.lm_head_chunk_tokens) : 0;
  p.scratch_bytes = static_cast<size_t>(p.lm_head_rows * cfg.model.vocab_size) * act + static_cast<size_t>(T) * sizeof(float);
  if (act_dtype == DType::BF16)
    p.attention_ds_bytes = static_cast<size_t>(attention_ds_bytes(
        cfg.dataset.micro_batch_size, cfg.dataset.max_seq_length, cfg.model.num_attention_heads, cfg.model.head_dim()));
  // The W13 call's tails are the widest: dy 2f and x d columns.
  if (act_dtype == DType::BF16 && expert_wgrad_group(cfg) > 1)
    p.wgrad_tail_bytes = static_cast<size_t>(wgrad_tail_bytes(
        expert_wgrad_group(cfg), local_experts(cfg), 2 * cfg.model.intermediate_size + cfg.model.hidden_size));
  std::vector<std::pair<std::string, size_t>> all;
  for (const auto& e : planned.arena().entries()) all.emplace_back(e.name, e.bytes);
  std::sort(all.begin(), all.end(), [](auto& a, auto& b) { return a.second > b.second; });
  all.resize(std::min<size_t>(all.size(), 8));
  p.largest = all;
  return p;
}

namespace {
double gib(size_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0); }
}  // namespace

std::string format_memory_plan(const TrainConfig& cfg, const MemoryPlan& p) {
  // What the parameter line holds besides the fp32 state: the working copies the forward reads.
  const std::string act = dtype_name(p.act_dtype);
  const int64_t world = cfg.parallelism.dp_size * cfg.parallelism.ep_size;
  const bool sharded = world > 1;  // the dense master too (Trainer: dense_master_sharded_)
  const std::string working =
      p.act_dtype == DType::F32 ? (sharded ? " + fp32 working copy of the dense weights (the experts' master is their "
                                             "working copy)"
                                           : " (the master is the working copy)")
      : p.expert_working_bytes  ? " + " + act + " working copy"
                                : " + " + act + " working copy of the dense weights (experts: none, their MXFP8 "
                                  "copies are quantised from the fp32 master)";
  std::string s = fmt::format(
      "memory plan per rank (ep_size {}, dp_size {}, micro-batch {} x seq {}, activations {}):\n"
      "  parameters: {:.3f} B dense + {:.3f} B expert (this rank's {} of {} experts)\n"
      "  fp32 master + grads{} + AdamW{}: {:.2f} GiB (AdamW moments in {}: ZeRO-1 shards over {} ranks "
      "dense{}, {} expert)\n"
      "{}"
      "  activations (arena{}): {:.2f} GiB\n"
      "  LM-head logits ({}): {:.2f} GiB\n"
      "{}"
      "  total: {:.2f} GiB\n  largest activation buffers:\n",
      cfg.parallelism.ep_size, cfg.parallelism.dp_size, cfg.dataset.micro_batch_size, cfg.dataset.max_seq_length,
      act, p.dense_params / 1e9, p.expert_params / 1e9, local_experts(cfg), cfg.model.num_local_experts,
      std::string(cfg.expert_grad_dtype == "bfloat16" ? " (the experts' in bf16)" : "") +
          (cfg.lm_head_grad_dtype == "bfloat16" ? " (the LM head's in bf16)" : "") +
          (cfg.optimizer_store_param_remainders ? " (unsharded masters: working copy + 16-bit remainder)" : ""),
      working, gib(p.param_bytes),
      cfg.adamw_moments_dtype, world, sharded ? " with its fp32 master" : "", cfg.parallelism.dp_size,
      p.fp8_weight_bytes ? fmt::format("  MXFP8 weight copies ({}{}, {}): {:.2f} GiB\n",
                                       cfg.fp8.bf16_gemms() ? "E4M3 values in bf16, hopper_gemm=bf16: " : "E4M3 ",
                                       cfg.fp8.cache_columnwise_weights
                                           ? "rowwise + columnwise"
                                           : "rowwise; the columnwise ones one layer at a time, in the activations",
                                       cfg.fp8.keep_attention_bf16 ? "experts" : "experts, QKV, O",
                                       gib(p.fp8_weight_bytes))
                         : std::string(),
      std::string(cfg.recompute_experts ? "; the experts' h13 and SwiGLU output recomputed in the backward" : "") +
          (expert_wgrad_group(cfg) > 1
               ? fmt::format("; {} micro-batches' expert weight-gradient operands held per layer "
                             "(expert_wgrad_micro_batches)",
                             expert_wgrad_group(cfg) - 1)
               : std::string()) +
          (lm_head_wgrad_group(cfg) > 1
               ? fmt::format("; {} micro-batches' LM-head logit gradients held (lm_head_wgrad_micro_batches)",
                             lm_head_wgrad_group(cfg))
               : std::string()),
      gib(p.activation_bytes),
      p.lm_head_rows ? fmt::format("{} tokens at a time, lm_head_chunk_tokens", p.lm_head_rows)
                     : std::string("in the held logit gradients; per-token losses only"),
      gib(p.scratch_bytes),
      (p.attention_ds_bytes ? fmt::format("  attention backward dS tiles (one layer at a time): {:.2f} GiB\n",
                                          gib(p.attention_ds_bytes))
                            : std::string()) +
          (p.wgrad_tail_bytes ? fmt::format("  expert weight-gradient tail rows (one call at a time): {:.2f} GiB\n",
                                            gib(p.wgrad_tail_bytes))
                              : std::string()),
      gib(p.total_bytes()));
  for (const auto& [name, bytes] : p.largest) s += fmt::format("    {:<28} {:10.1f} MiB\n", name, bytes / 1048576.0);
  return s;
}

std::string plan_fit_problem(const TrainConfig& cfg, const MemoryPlan& p, size_t free_bytes) {
  if (free_bytes == 0 || p.total_bytes() + kPlanHeadroom <= free_bytes) return "";
  std::string s = fmt::format(
      "the memory plan needs {:.2f} GiB per rank (+{:.1f} GiB of headroom for NCCL, cuBLASLt and small scratch) "
      "but only {:.2f} GiB are free: parameters and optimizer state {:.2f} GiB, MXFP8 weight copies {:.2f} "
      "GiB, activations {:.2f} GiB, LM-head logits {:.2f} GiB, attention dS tiles {:.2f} GiB, expert "
      "weight-gradient tail rows {:.2f} GiB. To shrink it:",
      gib(p.total_bytes()), gib(kPlanHeadroom), gib(free_bytes), gib(p.param_bytes), gib(p.fp8_weight_bytes),
      gib(p.activation_bytes), gib(p.scratch_bytes), gib(p.attention_ds_bytes), gib(p.wgrad_tail_bytes));
  if (!cfg.recompute_experts) s += " recompute_experts=true (the experts' h13 and SwiGLU output rebuilt in the backward);";
  if (expert_wgrad_group(cfg) > 1)
    s += " expert_wgrad_micro_batches=1 (no micro-batch of expert operands held per layer);";
  if (lm_head_wgrad_group(cfg) > 1)
    s += " lm_head_wgrad_micro_batches=1 (no micro-batch of LM-head logit gradients held);";
  if (cfg.fp8.enabled && cfg.fp8.cache_columnwise_weights)
    s += " fp8_config.cache_columnwise_weights=false (dgrad weight copies one layer at a time);";
  if (cfg.fp8.bf16_gemms())
    s += " fp8_config.hopper_gemm=fp8 (E4M3 weight copies instead of bf16 ones, on slower GEMMs);";
  if (cfg.lm_head_chunk_tokens > 1024) s += " lm_head_chunk_tokens=1024;";
  if (cfg.dataset.micro_batch_size > 1) s += " a smaller dataset.micro_batch_size;";
  s += " more ranks (parallelism.ep_size / dp_size shard the experts and the optimizer state).";
  s += " `--dry-run backend=cuda` prints the plan without a GPU.";
  return s;
}

}  // namespace mxt
