// Mixtral: embedding -> N x [attention block, MoE block] -> RMSNorm -> LM head + cross-entropy.
#include <algorithm>
#include <array>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "mxtrain/model.hpp"
#include "mxtrain/trace.hpp"

namespace mxt {

MixtralModel::MixtralModel(const ModelConfig& cfg, Ops& ops, int64_t micro_batch, int64_t seq,
                           const ParamLayout& layout, bool allocate, const ExpertParallel& ep, const Fp8Config& fp8,
                           bool recompute_experts, int64_t expert_wgrad_micro_batches,
                           int64_t lm_head_wgrad_micro_batches)
    : cfg_(cfg), ops_(ops), B_(micro_batch), S_(seq), ep_(ep), fp8_(fp8), recompute_(recompute_experts),
      layout_(layout) {
  T_ = B_ * S_;
  k_ = cfg.num_experts_per_tok;
  E_ = cfg.num_local_experts;
  R_ = T_ * k_;
  d_ = cfg.hidden_size;
  f_ = cfg.intermediate_size;
  // Expert parallelism: this rank runs experts [ep.rank * El, (ep.rank+1) * El) on up to C received rows.
  if (ep_.size < 1 || E_ % ep_.size != 0 || ep_.rank < 0 || ep_.rank >= ep_.size)
    throw std::invalid_argument("MixtralModel: EP rank " + std::to_string(ep_.rank) + " of " +
                                std::to_string(ep_.size) + " for " + std::to_string(E_) + " experts");
  El_ = E_ / ep_.size;
  if (layout.num_local_experts != El_ || layout.first_expert != ep_.rank * El_)
    throw std::invalid_argument("MixtralModel: the parameter layout holds experts [" +
                                std::to_string(layout.first_expert) + ", +" + std::to_string(layout.num_local_experts) +
                                ") but EP rank " + std::to_string(ep_.rank) + " runs [" +
                                std::to_string(ep_.rank * El_) + ", +" + std::to_string(El_) + ")");
  const bool ep_on = ep_.size > 1;
  if (ep_on && allocate && (ep_.comm == nullptr || ep_.host == nullptr || ep_.comm->size() != ep_.size))
    throw std::invalid_argument("MixtralModel: expert parallelism over " + std::to_string(ep_.size) +
                                " ranks needs its EP communicators");
  C_ = ep_on ? ep_capacity_rows(T_, k_, E_, ep_.size, ep_.capacity_factor) : R_;
  if (const char* s = std::getenv("MXTRAIN_OVERLAP_SMS")) overlap_sms_ = std::max(0, std::atoi(s));
  mx_ = fp8.enabled;
  mx_bf16_ = fp8.bf16_gemms();
  // The FP8 kernels have their own weight-gradient kernels; hopper_gemm=bf16 holds dequantised operands instead.
  wgrad_group_ = fp8.fp8_kernels() ? 1 : std::max<int64_t>(1, expert_wgrad_micro_batches);
  lm_group_ = std::max<int64_t>(1, lm_head_wgrad_micro_batches);
  mx_attn_ = mx_ && !fp8.keep_attention_bf16;
  Cx_ = mx_ ? (C_ + 31) / 32 * 32 : C_;
  const int64_t hd = cfg.head_dim(), H = cfg.num_attention_heads, KVH = cfg.num_key_value_heads;
  ashape_ = AttnShape{B_, S_, H, KVH, hd, Tensor()};  // doc_ids are set per micro-batch
  aux_on_ = cfg.router_aux_loss_coef > 0;
  const bool jitter = cfg.router_jitter_noise > 0;

  acts_.resize(cfg.num_hidden_layers);
  const DType A = ops.act_dtype(), F = DType::F32, I = DType::I32;  // A: activations
  for (size_t l = 0; l < acts_.size(); ++l) {
    LayerActs& a = acts_[l];
    const std::string p = "layer" + std::to_string(l) + ".";
    arena_.add(a.x_in, p + "x_in", A, {T_, d_});
    if (!mx_attn_) arena_.add(a.ln1, p + "ln1", A, {T_, d_});  // MXFP8 attention: scratch, ln1_col kept (plan_fp8)
    arena_.add(a.rstd1, p + "rstd1", F, {T_});
    arena_.add(a.q, p + "q", A, {T_, H * hd});
    arena_.add(a.k, p + "k", A, {T_, KVH * hd});
    arena_.add(a.v, p + "v", A, {T_, KVH * hd});
    arena_.add(a.attn, p + "attn", A, {T_, H * hd});
    arena_.add(a.lse, p + "lse", F, {B_, H, S_});
    arena_.add(a.x_mid, p + "x_mid", A, {T_, d_});
    arena_.add(a.ln2, p + "ln2", A, {T_, d_});
    arena_.add(a.rstd2, p + "rstd2", F, {T_});
    if (jitter) {
      arena_.add(a.noise, p + "jitter_noise", A, {T_, d_});
      arena_.add(a.moe_in, p + "moe_in", A, {T_, d_});
    }
    arena_.add(a.probs, p + "router_probs", F, {T_, E_});
    arena_.add(a.topk_idx, p + "topk_idx", I, {T_, k_});
    arena_.add(a.topk_w, p + "topk_w", F, {T_, k_});
    arena_.add(a.offsets, p + "expert_offsets", I, {E_ + 1});
    arena_.add(a.perm, p + "perm", I, {R_});
    // MXFP8: xe and act are scratch (plan_fp8); the layer keeps their columnwise copies instead.
    if (ep_on) {  // xp / wp are only the dispatch's send buffers: one shared scratch (below)
      if (!mx_) arena_.add(a.xe, p + "expert_in", A, {C_, d_});
      arena_.add(a.we, p + "expert_weight", F, {C_});
      arena_.add(a.ep_meta, p + "ep_meta", I, {El_ + 1 + C_});
    } else {
      if (!mx_) arena_.add(a.xp, p + "expert_in", A, {R_, d_});
      arena_.add(a.wp, p + "expert_weight", F, {R_});
    }
    if (!recompute_) arena_.add(a.h13, p + "expert_h13", A, {C_, 2 * f_});
    if (!mx_ && !recompute_) arena_.add(a.act, p + "expert_act", A, {C_, f_});
  }
  held_.resize(wgrad_group_ > 1 ? acts_.size() : 0);
  for (size_t l = 0; l < held_.size(); ++l) {
    held_[l].resize(static_cast<size_t>(wgrad_group_ - 1));
    for (size_t s = 0; s < held_[l].size(); ++s) {
      HeldWgrad& h = held_[l][s];
      const std::string p = "layer" + std::to_string(l) + ".held_wgrad" + std::to_string(s) + "_";
      // MXFP8 (hopper_gemm=bf16) holds the dequantised columnwise copies, padded to whole 32-row blocks.
      const int64_t rows = mx_ ? Cx_ : C_;
      arena_.add(h.dye, p + "dexpert_out", A, {rows, d_});
      arena_.add(h.act, p + "expert_act", A, {rows, f_});
      arena_.add(h.dh13, p + "dexpert_h13", A, {rows, 2 * f_});
      arena_.add(h.xe, p + "expert_in", A, {rows, d_});
      arena_.add(h.offsets, p + "expert_offsets", I, {El_ + 1});
    }
  }
  if (recompute_) {  // every layer's forward writes them, its backward rebuilds them from the kept input
    arena_.add(s_.rc_h13, "scratch.expert_h13 (recomputed)", A, {C_, 2 * f_});
    if (!mx_) arena_.add(s_.rc_act, "scratch.expert_act (recomputed)", A, {C_, f_});
  }
  arena_.add(x_final_, "x_final", A, {T_, d_});
  arena_.add(ln_final_, "ln_final", A, {T_, d_});
  if (lm_group_ > 1) {
    arena_.add(lm_dz_, "lm_head.dlogits (held)", A, {lm_group_ * T_, cfg.vocab_size});
    arena_.add(lm_h_, "lm_head.final_hidden (held)", A, {lm_group_ * T_, d_});
  }
  arena_.add(rstd_final_, "rstd_final", F, {T_});
  arena_.add(s_.dx, "scratch.dx", A, {T_, d_});
  arena_.add(s_.dtmp, "scratch.dtmp", A, {T_, d_});
  arena_.add(s_.tmp, "scratch.tmp", A, {T_, d_});
  arena_.add(s_.dq, "scratch.dq", A, {T_, H * hd});
  arena_.add(s_.dk, "scratch.dk", A, {T_, KVH * hd});
  arena_.add(s_.dv, "scratch.dv", A, {T_, KVH * hd});
  arena_.add(s_.dattn, "scratch.dattn", A, {T_, H * hd});
  arena_.add(s_.logits, "scratch.router_logits", F, {T_, E_});
  arena_.add(s_.dlogits, "scratch.drouter_logits", F, {T_, E_});
  arena_.add(s_.logits_act, "scratch.router_logits_act", A, {T_, E_});
  arena_.add(s_.dlogits_act, "scratch.drouter_logits_act", A, {T_, E_});
  if (jitter) arena_.add(s_.noise_f32, "scratch.jitter_noise_f32", F, {T_, d_});
  if (cfg.router_force_load_balancing) arena_.add(s_.balanced_logits, "router_balanced_logits", F, {T_, E_});
  arena_.add(s_.dtopk_w, "scratch.dtopk_w", F, {R_});
  arena_.add(s_.yp, "scratch.expert_out", A, {R_, d_});
  arena_.add(s_.dyp, "scratch.dexpert_out", A, {ep_on ? R_ : Cx_, d_});  // without EP: also dye
  arena_.add(s_.dact, "scratch.dexpert_act", A, {C_, f_});
  if (!mx_) arena_.add(s_.dh13, "scratch.dexpert_h13", A, {Cx_, 2 * f_});  // MXFP8: in s_.mx_fwd_bwd (plan_fp8)
  arena_.add(s_.dxp, "scratch.dexpert_in", A, {R_, d_});
  arena_.add(s_.dwp, "scratch.dexpert_weight", F, {R_});
  if (ep_on) {
    arena_.add(s_.xp_send, "scratch.ep_send_rows", A, {R_, d_});
    arena_.add(s_.wp_send, "scratch.ep_send_weights", F, {R_});
    arena_.add(s_.ep_rows, "scratch.ep_rows", A, {C_, d_});
    arena_.add(s_.ep_w, "scratch.ep_weights", F, {C_});
    arena_.add(s_.dye, "scratch.dexpert_out_local", A, {Cx_, d_});
    arena_.add(s_.dxe, "scratch.dexpert_in_local", A, {C_, d_});
    arena_.add(s_.dwe, "scratch.dexpert_weight_local", F, {C_});
  }
  if (aux_on_) {
    arena_.add(s_.dprobs_aux, "scratch.daux_probs", F, {T_, E_});
    arena_.add(s_.aux_prob_sum, "scratch.aux_prob_sum", F, {E_});
    arena_.add(s_.aux_count, "scratch.aux_count", F, {E_});
    arena_.add(s_.aux_coef, "scratch.aux_coef", F, {E_});
  }
  if (mx_) plan_fp8();
  if (!allocate) return;
  arena_.finalize(ops_);
  if (mx_) {
    alias_fp8_scratch();
    mx_weights_arena_.finalize(ops_);
    // Shared buffers: the columnwise copies (cache_columnwise_weights=false; with hopper_gemm=bf16 their deq
    // copies), and with hopper_gemm=bf16 the codes of both directions (mx_stage_).
    for (LayerMxWeights& q : mxw_) {
      for (auto [m, shared, stage] :
           {std::tuple{&q.wq, &mx_col_.wq, &mx_stage_.wq}, {&q.wk, &mx_col_.wk, &mx_stage_.wk},
            {&q.wv, &mx_col_.wv, &mx_stage_.wv}, {&q.wo, &mx_col_.wo, &mx_stage_.wo},
            {&q.experts.w13, &mx_col_.experts.w13, &mx_stage_.experts.w13},
            {&q.experts.w2, &mx_col_.experts.w2, &mx_stage_.experts.w2}}) {
        if (!fp8_.cache_columnwise_weights) {
          m->col = shared->col;
          m->deq_col = shared->deq_col;
        }
        if (mx_bf16_) {
          m->row = stage->row;
          m->col = stage->col;
        }
      }
    }
    if (mx_attn_) {
      const int32_t off[2] = {0, static_cast<int32_t>(T_)};
      ops_.upload(s_.mx_dense_offsets.data, off, sizeof(off));
    }
  }
  if (!jitter)
    for (auto& a : acts_) a.moe_in = a.ln2;
  if (cfg.router_force_load_balancing) {
    // Token t's largest logits are 0, -1, ..., -(k-1) at experts k*t, k*t + 1, ... (mod E): its top-k are those.
    std::vector<float> z(static_cast<size_t>(T_ * E_));
    for (int64_t t = 0; t < T_; ++t)
      for (int64_t e = 0; e < E_; ++e) z[static_cast<size_t>(t * E_ + e)] = -static_cast<float>(((e - k_ * t) % E_ + E_) % E_);
    ops_.upload(s_.balanced_logits.data, z.data(), z.size() * sizeof(float));
  }
  // Without expert parallelism the experts run on the permuted rows themselves.
  for (auto& a : acts_) {
    if (recompute_) {
      a.h13 = s_.rc_h13;
      if (mx_) a.act_col = s_.rc_act_col;
      else a.act = s_.rc_act;
    }
    if (mx_) {
      a.xe = s_.mx_xe;
      a.act = s_.mx_act;
      if (!ep_on) a.xp = s_.mx_xe;
      if (mx_attn_) a.ln1 = s_.mx_ln1;
    }
    if (ep_on) {
      a.xp = s_.xp_send;
      a.wp = s_.wp_send;
    } else {
      a.xe = a.xp;
      a.we = a.wp;
    }
  }
  if (!ep_on) {
    s_.dye = s_.dyp;
    s_.dxe = s_.dxp;
    s_.dwe = s_.dwp;
  }
  ep_splits_.resize(acts_.size());
  expert_rows_.assign(acts_.size() * static_cast<size_t>(E_), 0);
  for (const LayerActs& a : acts_) own_xe_act_.emplace_back(a.xe, a.act);
}

// A micro-batch that holds its expert operands runs its forward with the experts' input and SwiGLU output in
// the held buffers themselves, so its backward has nothing to copy there (the recomputed SwiGLU output is
// shared scratch: that one is still copied).
void MixtralModel::set_micro_batch(int64_t index, int64_t count, bool overwrite) {
  mb_index_ = index;
  mb_count_ = count;
  overwrite_grads_ = overwrite && overwrites_expert_grads();
  overwrite_lm_ = overwrite && overwrites_lm_head_grad();
  if (held_.empty() || mx_) return;  // MXFP8 dequantises into the held buffers in its backward
  const bool hold = holds_wgrad();
  for (size_t l = 0; l < acts_.size(); ++l) {
    LayerActs& a = acts_[l];
    const HeldWgrad* h = hold ? &held_[l][static_cast<size_t>(wgrad_slot())] : nullptr;
    a.xe = h ? h->xe : own_xe_act_[l].first;
    if (ep_.size == 1) a.xp = a.xe;
    if (!recompute_) a.act = h ? h->act : own_xe_act_[l].second;
  }
}

void MixtralModel::bind(const Tensor& dense_w, const Tensor& expert_w, const Tensor& dense_g,
                        const Tensor& expert_g, const Tensor& lm_head_g) {
  // With MXFP8 the expert weights are only quantised (mx_quantize takes F32 too), so the trainer may bind its
  // fp32 master; the bf16 grouped GEMMs need them in the activation dtype.
  if (!mx_ && expert_w.dtype != ops_.act_dtype())
    throw std::invalid_argument(std::string("MixtralModel::bind: expert weights are ") + dtype_name(expert_w.dtype) +
                                ", the expert GEMMs need " + dtype_name(ops_.act_dtype()) +
                                " (only fp8_config.enabled reads them in another dtype)");
  w_ = bind_tensors(layout_, cfg_, dense_w, expert_w);
  g_ = bind_tensors(layout_, cfg_, dense_g, expert_g);
  if (lm_head_g.data != nullptr) {
    if (lm_group_ < 2 || lm_head_g.dtype != DType::BF16 || lm_head_g.numel() != g_.lm_head.numel())
      throw std::invalid_argument("MixtralModel::bind: a separate LM-head gradient must be BF16 [" +
                                  std::to_string(cfg_.vocab_size) + ", " + std::to_string(d_) +
                                  "] and stored by a held group (lm_head_wgrad_micro_batches > 1)");
    g_.lm_head = Tensor(lm_head_g.data, DType::BF16, {cfg_.vocab_size, d_}, lm_head_g.device);
  }
  mx_stale_ = true;
}

double MixtralModel::aux_loss_forward() {
  // HF load_balancing_loss_func over all layers' router outputs at once:
  //   aux = E * sum_e (count_e / N) * (prob_sum_e / N),  N = layers * tokens.
  std::vector<float> prob_sum(E_), count(E_), coef(E_);
  ops_.download(prob_sum.data(), s_.aux_prob_sum.data, E_ * sizeof(float));
  ops_.download(count.data(), s_.aux_count.data, E_ * sizeof(float));
  const double N = static_cast<double>(cfg_.num_hidden_layers) * static_cast<double>(T_);
  double aux = 0;
  for (int64_t e = 0; e < E_; ++e) {
    aux += (count[e] / N) * (prob_sum[e] / N);
    // d(aux_scale * coef * aux) / d probs[l, t, e]; the top-k mask carries no gradient.
    coef[e] = static_cast<float>(aux_grad_scale_ * cfg_.router_aux_loss_coef * E_ * count[e] / (N * N));
  }
  ops_.upload(s_.aux_coef.data, coef.data(), E_ * sizeof(float));
  return aux * static_cast<double>(E_);
}

namespace {
// Profiler range names per layer, built once: no string work per micro-batch (the model runs on one thread).
const char* trace_name(int layer, int stage) {
  static const char* const kStage[] = {"attention", "moe", "moe backward", "attention backward"};
  static std::vector<std::array<std::string, 4>> names;
  while (static_cast<int>(names.size()) <= layer) {
    const std::string prefix = "layer " + std::to_string(names.size()) + " ";
    names.push_back({prefix + kStage[0], prefix + kStage[1], prefix + kStage[2], prefix + kStage[3]});
  }
  return names[layer][stage].c_str();
}
}  // namespace

// lm_head_wgrad_micro_batches G > 1: this micro-batch's logit gradients and final hidden states go to its slot of
// the held buffers; the group's last micro-batch (or the step's) adds dW += dlogits^T h over all the group's rows
// in one GEMM, so dW's fp32 read-add-write happens once per group (the rows in micro-batch order). The step's first
// group stores dW instead, when set_micro_batch says so (no zeroing, no read of dW).
void MixtralModel::lm_head_backward_grouped(const MicroBatch& mb, float ce_scale, const Tensor& loss_sum) {
  const int64_t slot = mb_index_ % lm_group_, V = cfg_.vocab_size;
  ops_.copy(ln_final_, lm_h_.rows(slot * T_, T_));
  ops_.lm_head_loss(ln_final_, w_.lm_head, mb.labels, ce_scale, loss_sum, s_.dtmp, Tensor(),
                    lm_dz_.rows(slot * T_, T_));
  if (holds_for_group(lm_group_)) return;
  const int64_t rows = (slot + 1) * T_;
  const float beta = overwrite_lm_ && mb_index_ < lm_group_ ? 0.f : 1.f;
  ops_.gemm(true, false, V, d_, rows, 1.f, lm_dz_.rows(0, rows), lm_h_.rows(0, rows), beta, g_.lm_head);
}

double MixtralModel::forward_backward(const MicroBatch& mb, float ce_scale, float aux_scale,
                                      const Tensor& loss_sum, bool compute_grad, uint64_t jitter_seed) {
  mb_ = &mb;
  aux_grad_scale_ = aux_scale;
  if (mx_ && mx_stale_) {  // once per optimizer step: every micro-batch of the step reuses the copies
    TraceScope trace("quantize fp8 weights");
    quantize_fp8_weights();
    mx_stale_ = false;
  }
  if (aux_on_) {
    ops_.zero(s_.aux_prob_sum);
    ops_.zero(s_.aux_count);
  }
  ops_.embedding_forward(mb.ids, w_.embed, acts_[0].x_in);
  for (int l = 0; l < static_cast<int>(acts_.size()); ++l) {
    {
      TraceScope trace(trace_name(l, 0));
      attention_forward(l);
    }
    TraceScope trace(trace_name(l, 1));
    moe_forward(l, compute_grad, jitter_seed);
  }
  ops_.rmsnorm_forward(x_final_, w_.norm, static_cast<float>(cfg_.rms_norm_eps), ln_final_, rstd_final_);
  const double aux = aux_on_ ? aux_loss_forward() : 0.0;
  if (!compute_grad) {
    ops_.lm_head_loss(ln_final_, w_.lm_head, mb.labels, ce_scale, loss_sum, Tensor(), Tensor());
    return aux;
  }
  {
    TraceScope trace("lm head + loss (forward and backward)");
    if (lm_group_ > 1) lm_head_backward_grouped(mb, ce_scale, loss_sum);
    else ops_.lm_head_loss(ln_final_, w_.lm_head, mb.labels, ce_scale, loss_sum, s_.dtmp, g_.lm_head);
  }
  ops_.rmsnorm_backward(s_.dtmp, x_final_, w_.norm, rstd_final_, s_.dx, g_.norm);
  if (grads_done_) grads_done_(static_cast<int>(acts_.size()));
  for (int l = static_cast<int>(acts_.size()) - 1; l >= 0; --l) {
    {
      TraceScope trace(trace_name(l, 2));
      moe_backward(l);
    }
    TraceScope trace(trace_name(l, 3));
    attention_backward(l);
    if (grads_done_) grads_done_(l);
  }
  ops_.embedding_backward(mb.ids, s_.dx, g_.embed);
  return aux;
}

}  // namespace mxt
