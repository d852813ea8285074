#pragma once
// Mixtral forward and backward over the op interface (no autograd): each sublayer has an explicit forward
// that saves into the activation arena and a backward beside it.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "mxtrain/arena.hpp"
#include "mxtrain/comm.hpp"
#include "mxtrain/config.hpp"
#include "mxtrain/mx_buffers.hpp"
#include "mxtrain/ops.hpp"
#include "mxtrain/params.hpp"

namespace mxt {

struct MxExpertRun;  // src/model/mx_experts.hpp
struct MxDense;      // src/model/mx_linear.hpp

// What one layer's forward keeps for its backward.                      (T tokens, R = T*k routed rows)
// C: rows this rank's experts can receive (R without expert parallelism; ep_capacity_rows with it).
struct LayerActs {
  Tensor x_in;                  // (T, d) residual stream entering the layer
  Tensor ln1, rstd1;            // (T, d), (T)
  Tensor q, k, v;               // (T, H*hd), (T, KVH*hd) x2, after RoPE
  Tensor attn, lse;             // (T, H*hd), (B, H, S)
  Tensor x_mid;                 // (T, d) after the attention residual
  Tensor ln2, rstd2;            // (T, d), (T)
  Tensor noise;                 // (T, d) router jitter factors (only with jitter)
  Tensor moe_in;                // (T, d) = ln2 * noise (aliases ln2 without jitter)
  Tensor probs, topk_idx, topk_w;  // (T, E), (T, k), (T, k)
  Tensor offsets, perm;         // (E+1), (R)
  Tensor xp, wp;                // (R, d), (R): permuted rows and routing weights (this rank's tokens)
  Tensor xe, we;                // (C, d), (C): the rows this rank's experts run, expert-major (EP: received;
                                //   else aliases of xp, wp)
  Tensor ep_meta;               // (El+1+C) I32, EP only: local expert offsets, then the reorder (EpSplits::meta)
  Tensor h13, act;              // (C, 2f), (C, f); recompute_experts: shared scratch, rebuilt by the backward
  // fp8_config.enabled: xe and act are shared scratch (Scratch::mx_xe, mx_act) and the wgrads read these
  // columnwise MXFP8 copies instead, written by the forward (Cx = C rounded up to 32 rows).
  MxBuf xe_col, act_col;        // (Cx x d), (Cx x f) codes + scales
  // MXFP8 attention (fp8_config.enabled without keep_attention_bf16): ln1 is shared scratch too (Scratch::mx_ln1,
  // read only by the forward's QKV quantisation) and the QKV wgrads read this columnwise copy of it.
  MxBuf ln1_col;                // (T x d)
  // recompute_experts with MXFP8: the experts' input as the forward's rowwise copy, for the backward to recompute
  // h13 from (act_col is then shared scratch, rebuilt too).
  MxBuf xe_row;                 // (Cx x d)
};

// expert_wgrad_micro_batches > 1: a micro-batch's expert weight-gradient operands, held from its backward until
// the last micro-batch of its group, whose weight gradients then contract every held set and its own in one
// grouped GEMM (one fp32 dW read-add-write per group of micro-batches instead of per micro-batch).
struct HeldWgrad {
  Tensor dye, act, dh13, xe;    // (C, d), (C, f), (C, 2f), (C, d)
  Tensor offsets;               // (El+1) I32
  int64_t rows = 0;             // host: rows held (0: nothing held)
};

// A layer's weights quantised for MXFP8 (E4M3, rowwise + columnwise), once per optimizer step.
struct LayerMxWeights {
  MxWeight wq, wk, wv, wo;      // only without fp8_config.keep_attention_bf16
  MxExpertWeights experts;
};

// Backward scratch, reused by every layer (layers run backward one at a time).
struct Scratch {
  Tensor dx, dtmp;              // (T, d) gradient of the residual stream, and a sublayer's contribution
  Tensor tmp;                   // (T, d) forward sublayer output before the residual add
  Tensor dq, dk, dv, dattn;     // like q, k, v, attn
  Tensor logits, dlogits;       // (T, E) F32 for the router math
  Tensor logits_act, dlogits_act;  // (T, E) the gate GEMM's own dtype (HF computes the gate in bf16)
  Tensor noise_f32;             // (T, d) jitter factors as drawn on the host
  Tensor balanced_logits;       // (T, E) router_force_load_balancing: logits whose top-k is a round-robin
  Tensor dprobs_aux;            // (T, E)
  Tensor dtopk_w;               // (T*k)
  Tensor yp, dyp, dact, dh13, dxp, dwp;  // (R, d), (R, d), (C, f), (C, 2f), (R, d), (R)
  Tensor xp_send, wp_send;       // (R, d), (R) EP only: every layer's xp / wp (not kept for the backward)
  Tensor ep_rows, ep_w;         // (C, d), (C) EP only: rows / weights in the all-to-all's peer-major order
  Tensor dye, dxe, dwe;         // (C, d), (C, d), (C) EP only (else aliases of dyp, dxp, dwp)
  Tensor aux_prob_sum, aux_count, aux_coef;  // (E)
  // fp8_config.enabled
  // mx_fwd_bwd: one buffer for scratch that is never live at once (every layer's forward ends before the
  // micro-batch's backward starts): the backward's dh13 over it, and the forward-only mx_xe, mx_act (MoE
  // forward) and mx_ln1 (attention forward). Views cut by alias_fp8_scratch(); without MXFP8 dh13 is its own.
  Tensor mx_fwd_bwd;            // max(Cx x 2f, Cx x (f + d), T x d with MXFP8 attention) elements
  Tensor mx_xe, mx_act;         // (Cx, d), (Cx, f): the experts' input and activation, not kept per layer
  Tensor mx_ln1;                // (T, d) MXFP8 attention: every layer's ln1 (the layer keeps ln1_col)
  MxBuf mx_a, mx_b, mx_c;       // MXFP8 scratch copies (a, b: Cx x max(d, 2f) or T x d; c: T x d)
  Tensor mx_dense_offsets;      // (2) I32 {0, T}: a dense linear is a one-group grouped GEMM
  Tensor mx_deq_a, mx_deq_b;    // hopper_gemm=bf16: dequantised GEMM operands (MxExpertRun / MxDense deq_a, deq_b)
  // recompute_experts: one h13 (and act / act_col) for all layers, rebuilt in each layer's backward
  Tensor rc_h13, rc_act;        // (C, 2f), (C, f) (rc_act: bf16 path only; MXFP8 uses mx_act)
  MxBuf rc_act_col;             // (Cx x f) MXFP8 only
};

struct MicroBatch {  // device tensors
  Tensor ids, labels, pos;  // (T) I32
  Tensor doc_ids;           // (T) I32 with sequence packing: attention stays inside each document; else empty
};

class MixtralModel {
 public:
  // allocate=false only plans the activation arena (for --dry-run): no memory, no forward.
  // ep: the expert-parallel group (layout must hold experts [ep.rank * E/ep.size, ...)); its comms may be
  // null when allocate=false.
  MixtralModel(const ModelConfig& cfg, Ops& ops, int64_t micro_batch, int64_t seq, const ParamLayout& layout,
               bool allocate = true, const ExpertParallel& ep = {}, const Fp8Config& fp8 = {},
               bool recompute_experts = false, int64_t expert_wgrad_micro_batches = 1,
               int64_t lm_head_wgrad_micro_batches = 1);

  // Point the model at its weights and gradient buffers (flat, laid out by the ParamLayout). expert_w is in the
  // activation dtype, or, with fp8_config.enabled, may be F32 (the fp32 master: the experts then read only the
  // MXFP8 copies quantised from it).
  // lm_head_g (lm_head_grad_dtype=bfloat16): the LM head's gradient in its own BF16 [vocab, hidden] buffer instead of
  // its slice of dense_g; only with a held group (lm_head_wgrad_micro_batches > 1), whose one GEMM stores it.
  void bind(const Tensor& dense_w, const Tensor& expert_w, const Tensor& dense_g, const Tensor& expert_g,
            const Tensor& lm_head_g = Tensor());
  // Called during the backward when a part's gradients are final for this micro-batch: num_hidden_layers for the
  // head (final norm and LM head), then each layer l from the last down (its attention, norms, router, experts).
  // The embedding's come last, when forward_backward returns. Empty: no calls.
  void set_grads_done_hook(std::function<void(int)> hook) { grads_done_ = std::move(hook); }

  // Which micro-batch of the optimizer step the next forward_backward is (index of count): with
  // expert_wgrad_micro_batches G > 1, micro-batches [jG, jG + G) form a group whose last one contracts the
  // others' held expert weight-gradient operands. overwrite: the step's first group writes the gradients the model
  // can overwrite (overwrites_expert_grads, overwrites_lm_head_grad) instead of adding to them (the caller did not
  // zero those). The default (0 of 1, adding) never holds.
  void set_micro_batch(int64_t index, int64_t count, bool overwrite = false);
  // Whether set_micro_batch's overwrite takes effect for the expert gradients (the bf16 experts; the MXFP8 ones
  // add) and for the LM head's (lm_head_wgrad_micro_batches > 1: its grouped weight-gradient GEMM stores).
  bool overwrites_expert_grads() const { return !mx_; }
  bool overwrites_lm_head_grad() const { return lm_group_ > 1; }
  // Where each bf16 expert weight gradient is one storing GEMM per step (overwritten, in groups covering all
  // `count` micro-batches), that GEMM can add the gradient's sum of squares for the clipping norm as it stores it:
  // set_expert_grad_norm(acc) makes the steps that overwrite (set_micro_batch) add into acc (F32 [1]; empty:
  // stop). The caller zeroes acc per step and must not reduce the expert gradients afterwards (one replica of
  // each expert).
  bool can_add_expert_grad_norm(int64_t count) const { return !mx_ && wgrad_group_ >= count; }
  void set_expert_grad_norm(const Tensor& acc) { grad_norm_acc_ = acc; }

  // One micro-batch. loss_sum[0] += summed token cross-entropy. With compute_grad, gradients of
  // ce_scale * sum(token CE) + aux_scale * coef * aux_loss are accumulated into the gradient buffers.
  // jitter_seed feeds router jitter (training only). Returns the load-balancing aux loss (0 when off).
  double forward_backward(const MicroBatch& mb, float ce_scale, float aux_scale, const Tensor& loss_sum,
                          bool compute_grad, uint64_t jitter_seed);

  const Arena& arena() const { return arena_; }
  // fp8_config.enabled: the MXFP8 weight copies (planned like the activations, allocated with the model).
  const Arena& mx_weight_arena() const { return mx_weights_arena_; }
  // The weights changed (optimizer step, checkpoint load, init): the next forward re-quantises them.
  void invalidate_fp8_weights() { mx_stale_ = true; }
  // Whether the next forward_backward quantises the weights first; a replayed capture of one that did has
  // done it again, which the caller reports with fp8_weights_refreshed().
  bool fp8_weights_stale() const { return mx_ && mx_stale_; }
  void fp8_weights_refreshed() { mx_stale_ = false; }
  const Tensor& final_hidden() const { return ln_final_; }  // (T, d) after the final norm, for logits dumps
  const Tensor& topk_indices(int layer) const { return acts_[layer].topk_idx; }  // (T, k) I32: the experts picked
  int64_t tokens() const { return T_; }
  // Expert parallelism: rows the EP group routed to each expert slot [layer * E + e] over the training forwards
  // since the last reset (parallelism.ep_rebalance_interval places experts by them).
  const std::vector<int64_t>& expert_rows() const { return expert_rows_; }
  void reset_expert_rows() { std::fill(expert_rows_.begin(), expert_rows_.end(), 0); }

 private:
  void attention_forward(int l);
  void attention_backward(int l);  // scratch.dx: in = grad wrt x_mid, out = grad wrt x_in
  void moe_forward(int l, bool training, uint64_t jitter_seed);
  void moe_backward(int l);        // scratch.dx: in = grad wrt layer output, out = grad wrt x_mid
  void experts_up(int l, int64_t n, const Tensor& off);  // bf16: h13 and act of layer l's n expert rows
  void experts_backward(int l, int64_t n, const Tensor& off, const Tensor& dye,
                        const std::function<void()>& combine);  // bf16
  // Expert parallelism (moe_dispatch.cpp): rows to / from the ranks that own the experts.
  int64_t moe_dispatch(int l, const std::function<void()>& permute);  // xp, wp -> xe, we; returns the rows received
  void moe_combine(int l, const Tensor& ye);            // expert outputs (n rows) -> s_.yp
  void moe_dispatch_grad(int l, const Tensor& dye);   // s_.dyp -> dye
  // s_.dxe, s_.dwe -> s_.dxp, s_.dwp; start: the exchange runs alongside what follows, until wait_started()
  void moe_combine_grad(int l, bool start);
  double aux_loss_forward();       // after all layers: aux loss and per-expert gradient coefficients
  // MXFP8 (model_fp8.cpp)
  void plan_fp8();                 // the MXFP8 buffers, in arena_ and mx_weights_arena_
  void alias_fp8_scratch();        // after the arena's finalize: the views into s_.mx_fwd_bwd
  void quantize_fp8_weights();     // every MXFP8 weight copy from the bound weights (experts: F32 master on CUDA)
  // fp8_config.cache_columnwise_weights=false: layer l's dgrad (columnwise) copies, into the shared mx_col_,
  // just before its backward needs them (attention: QKV and O; else the experts' w13 and w2).
  void quantize_fp8_colwise(int l, bool attention);
  MxExpertRun mx_run(int l, int64_t n, const Tensor& offsets) const;
  // hopper_gemm=bf16 with held expert weight-gradient operands: MxExpertRun::wgrad for layer l's n rows.
  std::function<void(const mxfp8::MxView&, const mxfp8::MxView&, const Tensor&)> mx_held_wgrad(int l, int64_t n,
                                                                                              const Tensor& off);
  MxDense mx_dense() const;

  ModelConfig cfg_;
  Ops& ops_;
  int64_t B_, S_, T_, R_, E_, k_, d_, f_;
  ExpertParallel ep_;
  int64_t El_ = 0, C_ = 0;         // local experts, expert-side rows (capacity)
  int overlap_sms_ = 0;            // SMs the GEMMs leave to an overlapped exchange (MXTRAIN_OVERLAP_SMS)
  Fp8Config fp8_;
  bool mx_ = false, mx_attn_ = false;  // expert GEMMs / attention projections in MXFP8
  bool recompute_ = false;         // recompute_experts
  int64_t wgrad_group_ = 1;        // expert_wgrad_micro_batches (bf16 experts only)
  std::vector<std::vector<HeldWgrad>> held_;  // [layer][slot]: wgrad_group_ - 1 held micro-batches
  std::vector<std::pair<Tensor, Tensor>> own_xe_act_;  // [layer]: the layer's own xe and act buffers
  // This micro-batch's place in its group, and whether it holds its expert operands for the group's last.
  int64_t wgrad_slot() const { return mb_index_ % wgrad_group_; }
  // Layer l's held row sets before this micro-batch's slot that have rows, as (dy, x) = the members hdy, hx.
  std::vector<Ops::WgradRowSet> held_sets(int l, Tensor HeldWgrad::*hdy, Tensor HeldWgrad::*hx) const;
  bool holds_wgrad() const { return holds_for_group(wgrad_group_); }
  // Whether this micro-batch, in groups of `group`, is neither its group's last nor the step's: it holds operands.
  bool holds_for_group(int64_t group) const { return mb_index_ % group + 1 < group && mb_index_ + 1 < mb_count_; }
  int64_t mb_index_ = 0, mb_count_ = 1;
  // lm_head_wgrad_micro_batches G > 1: the logits' gradients and final hidden states of a group's micro-batches,
  // [G * T, V] and [G * T, d]; the group's last micro-batch contracts them all into the LM head's gradient.
  int64_t lm_group_ = 1;
  Tensor lm_dz_, lm_h_;
  void lm_head_backward_grouped(const MicroBatch& mb, float ce_scale, const Tensor& loss_sum);
  bool overwrite_grads_ = false;   // the step's first group writes the expert gradients
  bool overwrite_lm_ = false;      // ... and the LM head's
  Tensor grad_norm_acc_;           // set_expert_grad_norm
  LayerMxWeights mx_col_;          // cache_columnwise_weights=false: every layer's columnwise copies, shared
  bool mx_bf16_ = false;           // fp8_config.hopper_gemm=bf16 (the weights' deq copies; codes shared in mx_stage_)
  LayerMxWeights mx_stage_;        // hopper_gemm=bf16: one layer's weight codes, dequantised into each layer's copies
  std::function<void(int)> grads_done_;
  mxfp8::Format mx_fwd_ = mxfp8::Format::E4M3, mx_grad_ = mxfp8::Format::E4M3;
  int64_t Cx_ = 0;                 // C rounded up to 32 with MXFP8 (the columnwise copies block tokens), else C
  std::vector<LayerMxWeights> mxw_;
  bool mx_stale_ = true;
  std::vector<int64_t> expert_rows_;  // expert_rows()
  std::vector<EpSplits> ep_splits_;  // per layer, host: the last forward's splits, reused by the backward
  AttnShape ashape_;
  ParamLayout layout_;
  ModelTensors w_, g_;
  std::vector<LayerActs> acts_;
  Scratch s_;
  Tensor x_final_, ln_final_, rstd_final_;
  const MicroBatch* mb_ = nullptr;
  bool aux_on_ = false;
  float aux_grad_scale_ = 0.f;
  Arena arena_;
  Arena mx_weights_arena_;
};

}  // namespace mxt
