#include "mxtrain/trainer.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "mxtrain/lr_schedule.hpp"
#include "mxtrain/metrics.hpp"
#include "mxtrain/safetensors.hpp"

#include <nlohmann/json.hpp>
#include <filesystem>
#include <fstream>

namespace mxt {

namespace {
int64_t local_experts(const TrainConfig& c) { return c.model.num_local_experts / c.parallelism.ep_size; }
}  // namespace

Trainer::Trainer(const TrainConfig& cfg, Ops& ops, std::vector<int32_t> tokens, int rank, int world)
    : cfg_(cfg),
      ops_(ops),
      rank_(rank),
      world_(world),
      layout_(ParamLayout::build(cfg.model, 0, cfg.model.num_local_experts)),
      loader_(std::move(tokens), cfg.dataset, cfg.seed, rank, world) {
  const int64_t T = cfg.dataset.micro_batch_size * cfg.dataset.max_seq_length;
  const DType F = DType::F32;
  for (auto* fp : {&dense_, &expert_}) {
    const int64_t n = fp == &dense_ ? layout_.dense_numel : layout_.expert_numel;
    const std::string p = fp == &dense_ ? "dense." : "expert.";
    state_.add(fp->master, p + "master", F, {n});
    state_.add(fp->grad, p + "grad", F, {n});
    state_.add(fp->adam_m, p + "adam_m", F, {n});
    state_.add(fp->adam_v, p + "adam_v", F, {n});
    if (ops.act_dtype() != F) state_.add(fp->working, p + "working", ops.act_dtype(), {n});
  }
  state_.add(mb_.ids, "batch.ids", DType::I32, {T});
  state_.add(mb_.labels, "batch.labels", DType::I32, {T});
  state_.add(mb_.pos, "batch.pos", DType::I32, {T});
  state_.add(loss_slots_, "loss_slots", F, {cfg.grad_acc_steps});
  state_.add(norm_acc_, "grad_norm_sq", F, {1});
  state_.finalize(ops_);
  if (ops.act_dtype() == F) {
    dense_.working = dense_.master;
    expert_.working = expert_.master;
  }

  std::vector<float> dense, expert;
  if (cfg.init_from_pretrained.empty()) {
    init_params_host(layout_, cfg.model, cfg.seed, dense, expert);
  } else {
    import_hf_weights(cfg.init_from_pretrained, layout_, cfg.model, dense, expert);
    if (rank == 0) spdlog::info("weights from {}", cfg.init_from_pretrained);
  }
  ops_.upload(dense_.master.data, dense.data(), dense.size() * sizeof(float));
  ops_.upload(expert_.master.data, expert.data(), expert.size() * sizeof(float));
  refresh_working_weights();

  model_ = std::make_unique<MixtralModel>(cfg.model, ops_, cfg.dataset.micro_batch_size,
                                          cfg.dataset.max_seq_length, layout_);
  model_->bind(dense_.working, expert_.working, dense_.grad, expert_.grad);
}

void Trainer::refresh_working_weights() {
  for (FlatParams* fp : {&dense_, &expert_})
    if (fp->working.data != fp->master.data) ops_.copy(fp->master, fp->working);
}

void Trainer::load_micro_batch(int64_t) {
  loader_.next(batch_);
  const size_t bytes = batch_.input_ids.size() * sizeof(int32_t);
  ops_.upload(mb_.ids.data, batch_.input_ids.data(), bytes);
  ops_.upload(mb_.labels.data, batch_.labels.data(), bytes);
  ops_.upload(mb_.pos.data, batch_.positions.data(), bytes);
  n_valid_ = std::count_if(batch_.labels.begin(), batch_.labels.end(), [](int32_t x) { return x >= 0; });
}

StepResult Trainer::train_step() {
  const int64_t acc = cfg_.grad_acc_steps;
  ops_.zero(dense_.grad);
  ops_.zero(expert_.grad);
  ops_.zero(loss_slots_);
  std::vector<int64_t> n_valid(acc);
  double aux_sum = 0;
  for (int64_t i = 0; i < acc; ++i) {
    load_micro_batch(i);
    n_valid[i] = n_valid_;
    // Each micro-batch's loss is a mean over its own tokens, and the step averages micro-batches (HF + recipe).
    const float ce_scale = 1.f / static_cast<float>(std::max<int64_t>(1, n_valid[i]) * acc);
    const uint64_t jitter_seed = cfg_.seed ^ (static_cast<uint64_t>(step_ * acc + i) * 0x9E3779B97F4A7C15ull);
    aux_sum += model_->forward_backward(mb_, ce_scale, 1.f / static_cast<float>(acc), loss_slots_.rows(i, 1),
                                        true, jitter_seed);
  }
  StepResult r;
  std::vector<float> slots(acc);
  ops_.download(slots.data(), loss_slots_.data, acc * sizeof(float));
  for (int64_t i = 0; i < acc; ++i) r.loss += slots[i] / std::max<int64_t>(1, n_valid[i]);
  r.loss /= static_cast<double>(acc);
  r.aux_loss = aux_sum / static_cast<double>(acc);
  r.loss += cfg_.model.router_aux_loss_coef * r.aux_loss;

  ops_.zero(norm_acc_);
  ops_.sum_squares(dense_.grad, norm_acc_);
  ops_.sum_squares(expert_.grad, norm_acc_);
  float norm_sq = 0;
  ops_.download(&norm_sq, norm_acc_.data, sizeof(float));
  r.grad_norm = std::sqrt(static_cast<double>(norm_sq));
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
  ops_.adamw_step(dense_.master, dense_.grad, dense_.adam_m, dense_.adam_v, s);
  ops_.adamw_step(expert_.master, expert_.grad, expert_.adam_m, expert_.adam_v, s);
  refresh_working_weights();
  ++step_;
  return r;
}

std::vector<double> Trainer::run() {
  std::vector<double> losses;
  const int64_t total = cfg_.num_train_steps;
  const int64_t tokens_per_step =
      cfg_.grad_acc_steps * cfg_.dataset.micro_batch_size * cfg_.dataset.max_seq_length * world_;
  std::unique_ptr<MetricsLog> log;
  if (rank_ == 0) {
    const std::string path =
        cfg_.logger.metrics_file.empty() ? cfg_.output_dir + "/metrics.jsonl" : cfg_.logger.metrics_file;
    log = std::make_unique<MetricsLog>(path);
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
      m.elapsed_s = elapsed;
      m.eta_s = elapsed / static_cast<double>(step_ - first) * static_cast<double>(total - step_);
      log->log(m);
      if (step_ == first + 1 || step_ == total) log_device_memory();
      t_last = now;
      step_last = step_;
    }
  }
  if (rank_ == 0 && cfg_.checkpoint.save_final_model && !cfg_.checkpoint.ckpt_dir.empty()) {
    const std::string dir = cfg_.checkpoint.ckpt_dir + "/final_model";
    export_final_model(dir);
    spdlog::info("final model (HF safetensors, {}) -> {}", cfg_.checkpoint.final_model_dtype, dir);
  }
  return losses;
}

void Trainer::log_device_memory() {
  const size_t peak = ops_.peak_allocated();
  if (peak == 0) return;
  const MemoryPlan plan = plan_memory(cfg_, ops_);
  const double planned = static_cast<double>(plan.param_bytes + plan.activation_bytes + plan.scratch_bytes);
  spdlog::info("device memory: peak allocated {:.3f} GiB, plan {:.3f} GiB ({:+.1f}%)", peak / 1073741824.0,
               planned / 1073741824.0, 100.0 * (static_cast<double>(peak) / planned - 1.0));
}

void Trainer::master_weights(std::vector<float>& dense, std::vector<float>& expert) {
  dense.resize(layout_.dense_numel);
  expert.resize(layout_.expert_numel);
  ops_.download(dense.data(), dense_.master.data, dense.size() * sizeof(float));
  ops_.download(expert.data(), expert_.master.data, expert.size() * sizeof(float));
}

void Trainer::export_final_model(const std::string& dir) {
  std::vector<float> dense, expert;
  master_weights(dense, expert);
  export_hf_weights(dir, layout_, cfg_.model, dense, expert,
                    cfg_.checkpoint.final_model_dtype == "bfloat16" ? DType::BF16 : DType::F32);
}

void Trainer::dump_first_batch(const std::string& dir) {
  namespace fs = std::filesystem;
  fs::create_directories(dir);
  ops_.zero(dense_.grad);
  ops_.zero(expert_.grad);
  ops_.zero(loss_slots_);
  load_micro_batch(0);
  const float ce_scale = 1.f / static_cast<float>(std::max<int64_t>(1, n_valid_));
  const double aux = model_->forward_backward(mb_, ce_scale, 1.f, loss_slots_.rows(0, 1), true, cfg_.seed);
  float loss_sum = 0;
  ops_.download(&loss_sum, loss_slots_.data, sizeof(float));
  const double ce = loss_sum / static_cast<double>(std::max<int64_t>(1, n_valid_));

  std::vector<float> gd(layout_.dense_numel), ge(layout_.expert_numel);
  ops_.download(gd.data(), dense_.grad.data, gd.size() * sizeof(float));
  ops_.download(ge.data(), expert_.grad.data, ge.size() * sizeof(float));
  export_hf_weights(dir + "/grads", layout_, cfg_.model, gd, ge, DType::F32);

  // Logits of the same batch from the saved final hidden state (outside the step: allocation is fine here).
  const Tensor& h = model_->final_hidden();
  const int64_t T = h.dim(0), V = cfg_.model.vocab_size;
  const ModelTensors w = bind_tensors(layout_, cfg_.model, dense_.working, expert_.working);
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
  write_file_atomic(dir + "/loss.json", j.dump(2) + "\n");
}

MemoryPlan plan_memory(const TrainConfig& cfg, Ops& ops) {
  MemoryPlan p;
  const ParamLayout layout = ParamLayout::build(cfg.model, 0, local_experts(cfg));
  p.dense_params = layout.dense_numel;
  p.expert_params = layout.expert_numel;
  // fp32 master + gradient + two AdamW moments.
  const size_t working = ops.act_dtype() == DType::F32 ? 0 : dtype_size(ops.act_dtype());
  p.param_bytes = static_cast<size_t>(layout.dense_numel + layout.expert_numel) * (4 * sizeof(float) + working);
  MixtralModel planned(cfg.model, ops, cfg.dataset.micro_batch_size, cfg.dataset.max_seq_length, layout, false);
  p.activation_bytes = planned.arena().total_bytes();
  std::vector<std::pair<std::string, size_t>> all;
  for (const auto& e : planned.arena().entries()) all.emplace_back(e.name, e.bytes);
  std::sort(all.begin(), all.end(), [](auto& a, auto& b) { return a.second > b.second; });
  all.resize(std::min<size_t>(all.size(), 8));
  p.largest = all;
  return p;
}

std::string format_memory_plan(const TrainConfig& cfg, const MemoryPlan& p) {
  auto gib = [](size_t b) { return static_cast<double>(b) / (1024.0 * 1024.0 * 1024.0); };
  std::string s = fmt::format(
      "memory plan per rank (ep_size {}, dp_size {}, micro-batch {} x seq {}):\n"
      "  parameters: {:.3f} B dense + {:.3f} B expert (this rank's {} of {} experts)\n"
      "  fp32 master + grads + AdamW (+ working copy): {:.2f} GiB\n"
      "  activations (arena): {:.2f} GiB\n"
      "  total: {:.2f} GiB\n  largest activation buffers:\n",
      cfg.parallelism.ep_size, cfg.parallelism.dp_size, cfg.dataset.micro_batch_size, cfg.dataset.max_seq_length,
      p.dense_params / 1e9, p.expert_params / 1e9, local_experts(cfg), cfg.model.num_local_experts,
      gib(p.param_bytes), gib(p.activation_bytes), gib(p.param_bytes + p.activation_bytes));
  for (const auto& [name, bytes] : p.largest) s += fmt::format("    {:<28} {:10.1f} MiB\n", name, bytes / 1048576.0);
  return s;
}

}  // namespace mxt
