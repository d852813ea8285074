// RMSNorm -> route -> permute -> [dispatch] -> experts (grouped GEMM, SwiGLU x routing weight, grouped GEMM)
// -> [combine] -> unpermute -> residual, and its backward in reverse stage order. dispatch / combine (expert
// parallelism only, moe_dispatch.cpp) move rows to and from the ranks that own their experts; the experts
// then run on n received rows with this rank's local expert offsets.
#include <optional>
#include <stdexcept>
#include <vector>

#include "linear.hpp"
#include "model/mx_experts.hpp"
#include "mxtrain/model.hpp"
#include "mxtrain/rng.hpp"
#include "mxtrain/trace.hpp"

namespace mxt {

// bf16 experts' first half: h13 = xe W13, act = SwiGLU(h13) x routing weight (the forward, and its recompute).
void MixtralModel::experts_up(int l, int64_t n, const Tensor& off) {
  const LayerActs& a = acts_[l];
  ops_.grouped_gemm_swiglu(a.xe.rows(0, n), w_.layers[l].w13, off, a.we.rows(0, n), a.h13.rows(0, n),
                           a.act.rows(0, n));
}

void MixtralModel::moe_forward(int l, bool training, uint64_t jitter_seed) {
  LayerActs& a = acts_[l];
  const LayerTensors& w = w_.layers[l];
  std::optional<TraceScope> part(std::in_place, "moe: norm + router");  // sub-stages for MXTRAIN_STAGE_TIMING
  ops_.rmsnorm_forward(a.x_mid, w.ln2, static_cast<float>(cfg_.rms_norm_eps), a.ln2, a.rstd2);
  if (cfg_.router_jitter_noise > 0) {
    // HF scales the hidden states seen by both the router and the experts by U(1-j, 1+j) while training.
    std::vector<float> noise(static_cast<size_t>(T_ * d_), 1.f);
    if (training) {
      Rng rng(splitmix64(jitter_seed) ^ static_cast<uint64_t>(l));
      const double j = cfg_.router_jitter_noise;
      for (auto& x : noise) x = static_cast<float>(1.0 - j + 2.0 * j * rng.uniform());
    }
    ops_.upload(s_.noise_f32.data, noise.data(), noise.size() * sizeof(float));
    ops_.copy(s_.noise_f32, a.noise);
    ops_.mul(a.ln2, a.noise, a.moe_in);
  }
  // route
  linear_forward(ops_, a.moe_in, w.gate, s_.logits_act);
  ops_.copy(s_.logits_act, s_.logits);
  if (cfg_.router_force_load_balancing) ops_.copy(s_.balanced_logits, s_.logits);  // benchmarking only
  ops_.router_forward(s_.logits, static_cast<int>(k_), a.probs, a.topk_idx, a.topk_w);
  if (aux_on_) ops_.router_aux_stats(a.probs, a.topk_idx, s_.aux_prob_sum, s_.aux_count);
  // permute
  part.emplace("moe: permute");
  ops_.moe_plan(a.topk_idx, static_cast<int>(E_), a.offsets, a.perm);
  auto permute = [&] {
    ops_.moe_permute(a.moe_in, a.perm, static_cast<int>(k_), a.xp.rows(0, R_));
    ops_.moe_permute_weights(a.topk_w.view({R_}), a.perm, a.wp);
  };
  // dispatch
  const bool ep = ep_.size > 1;
  if (!ep) permute();
  const int64_t n = ep ? moe_dispatch(l, permute) : R_;
  if (ep && training) {
    const std::vector<int64_t>& rows = ep_splits_[l].expert_rows;
    for (int64_t e = 0; e < E_; ++e) expert_rows_[static_cast<size_t>(l * E_ + e)] += rows[static_cast<size_t>(e)];
  }
  const Tensor off = ep ? a.ep_meta.rows(0, El_ + 1) : a.offsets;
  // experts (their output: straight into yp, or into dxe, free until the backward, for the combine)
  const Tensor ye = ep ? s_.dxe.rows(0, n) : s_.yp;
  part.reset();
  std::optional<TraceScope> trace_experts(std::in_place, "experts");
  if (n > 0 && mx_) {
    mx_experts_forward(ops_, mx_run(l, n, off), mxw_[l].experts, a.xe, a.we.rows(0, n), a.h13, a.act, ye);
  } else if (n > 0) {
    experts_up(l, n, off);
    ops_.grouped_gemm(a.act.rows(0, n), w.w2, off, ye);
  }
  trace_experts.reset();
  part.emplace("moe: unpermute + residual");
  // combine
  if (ep) moe_combine(l, ye);
  // unpermute (the routing weights were already applied inside SwiGLU)
  ops_.moe_unpermute_add(s_.yp, a.perm, static_cast<int>(k_), a.x_mid,
                         l + 1 < static_cast<int>(acts_.size()) ? acts_[l + 1].x_in : x_final_, s_.tmp);
}

// bf16 experts' backward on n rows. With expert_wgrad_micro_batches G > 1, every micro-batch of a group but its
// last (and the step's last) keeps its weight-gradient operands (all written straight into the held buffers; only
// a recomputed SwiGLU output is copied) and the group's last contracts all held row sets and its own per expert
// in one grouped GEMM (the held sets first, in micro-batch order: the order of the ungrouped accumulation, which
// the per-set fallback reproduces bit for bit; the Hopper kernel adds each set's partial last k-blocks after the
// whole ones, MXTRAIN_GG_WGRAD_GATHER).
std::vector<Ops::WgradRowSet> MixtralModel::held_sets(int l, Tensor HeldWgrad::*hdy, Tensor HeldWgrad::*hx) const {
  std::vector<Ops::WgradRowSet> sets;
  for (int64_t s = 0; s < wgrad_slot(); ++s) {
    const HeldWgrad& p = held_[l][static_cast<size_t>(s)];
    if (p.rows > 0) sets.push_back({(p.*hdy).rows(0, p.rows), (p.*hx).rows(0, p.rows), p.offsets});
  }
  return sets;
}

void MixtralModel::experts_backward(int l, int64_t n, const Tensor& off, const Tensor& dye,
                                    const std::function<void()>& combine) {
  const LayerActs& a = acts_[l];
  const LayerTensors& w = w_.layers[l];
  const LayerTensors& g = g_.layers[l];
  const int64_t slot = wgrad_slot();
  const bool hold = holds_wgrad();
  const bool accumulate = !(overwrite_grads_ && mb_index_ < wgrad_group_);  // the step's first group stores
  HeldWgrad* h = hold ? &held_[l][static_cast<size_t>(slot)] : nullptr;
  // dW (+)= the held sets' rows and this micro-batch's, whichever exist (a rank may receive none).
  auto wgrad = [&](const Tensor& dy, const Tensor& x, Tensor HeldWgrad::*hdy, Tensor HeldWgrad::*hx,
                   const Tensor& dW) {
    std::vector<Ops::WgradRowSet> sets = held_sets(l, hdy, hx);
    if (n > 0) sets.push_back({dy.rows(0, n), x.rows(0, n), off});
    TraceScope trace("experts wgrad");
    if (!grad_norm_acc_.data || !overwrite_grads_) {
      ops_.grouped_gemm_wgrad_sets(sets, dW, accumulate);
      return;
    }
    // The step's one storing GEMM per weight also sums its squares for the clipping norm (set_expert_grad_norm).
    if (accumulate || !can_add_expert_grad_norm(mb_count_))
      throw std::logic_error("set_expert_grad_norm: the expert weight gradients are not one storing GEMM per step");
    ops_.grouped_gemm_wgrad_sets_norm(sets, dW, grad_norm_acc_);
  };
  if (n > 0 && hold) {  // operands not already in the held buffers (set_micro_batch, moe_backward) are copied
    if (dye.data != h->dye.data) ops_.copy(dye.rows(0, n), h->dye.rows(0, n));
    if (a.act.data != h->act.data) ops_.copy(a.act.rows(0, n), h->act.rows(0, n));
    if (a.xe.data != h->xe.data) ops_.copy(a.xe.rows(0, n), h->xe.rows(0, n));
    ops_.copy(off, h->offsets);
    ops_.grouped_gemm_dgrad_swiglu(dye.rows(0, n), w.w2, off, a.h13.rows(0, n), a.we.rows(0, n),
                                   s_.dact.rows(0, n), h->dh13.rows(0, n), s_.dwe.rows(0, n));
    ops_.grouped_gemm_dgrad(h->dh13.rows(0, n), w.w13, off, s_.dxe.rows(0, n));
    combine();
  } else if (n > 0) {
    ops_.grouped_gemm_dgrad_swiglu(dye.rows(0, n), w.w2, off, a.h13.rows(0, n), a.we.rows(0, n),
                                   s_.dact.rows(0, n), s_.dh13.rows(0, n), s_.dwe.rows(0, n));
    wgrad(dye, a.act, &HeldWgrad::dye, &HeldWgrad::act, g.w2);
    ops_.grouped_gemm_dgrad(s_.dh13.rows(0, n), w.w13, off, s_.dxe.rows(0, n));
    combine();
    wgrad(s_.dh13, a.xe, &HeldWgrad::dh13, &HeldWgrad::xe, g.w13);
  } else {  // no rows of this micro-batch's own: the held ones alone, if any (or zeros, when overwriting)
    combine();
    if (!hold) {
      wgrad(dye, a.act, &HeldWgrad::dye, &HeldWgrad::act, g.w2);
      wgrad(s_.dh13, a.xe, &HeldWgrad::dh13, &HeldWgrad::xe, g.w13);
    }
  }
  if (h) h->rows = n;
}

void MixtralModel::moe_backward(int l) {
  LayerActs& a = acts_[l];
  const LayerTensors& w = w_.layers[l];
  const LayerTensors& g = g_.layers[l];
  const int k = static_cast<int>(k_);
  const bool ep = ep_.size > 1;
  // The experts' output gradient dye (without EP the permuted dy itself); a micro-batch that holds its expert
  // operands gets it straight in the held buffer.
  const Tensor dye =
      !held_.empty() && !mx_ && holds_wgrad() ? held_[l][static_cast<size_t>(wgrad_slot())].dye : s_.dye;
  // unpermute backward = permute of the output gradient
  std::optional<TraceScope> part(std::in_place, "moe bwd: unpermute");  // sub-stages for MXTRAIN_STAGE_TIMING
  ops_.moe_permute(s_.dx, a.perm, k, (ep ? s_.dyp : dye).rows(0, R_));
  // combine backward = dispatch of the output gradient, with the forward's splits
  if (ep) moe_dispatch_grad(l, dye);
  const int64_t n = ep ? ep_splits_[l].recv_rows : R_;
  const Tensor off = ep ? a.ep_meta.rows(0, El_ + 1) : a.offsets;
  // experts backward; dispatch backward = combine of the input and routing-weight gradients, as soon as they
  // exist: with overlap it runs alongside the w13 weight gradient, the last and largest GEMM
  const bool overlap = ep && ep_.overlap;
  part.reset();
  std::optional<TraceScope> trace_experts(std::in_place, "experts backward");
  auto combine = [&] {
    if (!ep) return;
    moe_combine_grad(l, overlap);
    if (overlap) {
      ops_.set_sm_reserve(overlap_sms_);
      ops_.set_exchange_alongside(true);
    }
  };
  if (mx_) quantize_fp8_colwise(l, false);
  if (n > 0 && recompute_) {  // h13 and act as the forward made them (shared scratch): same bits
    if (mx_) {
      mx_experts_recompute(ops_, mx_run(l, n, off), mxw_[l].experts, a.we.rows(0, n), a.h13, a.act);
    } else {
      experts_up(l, n, off);
    }
  }
  if (n > 0 && mx_) {
    MxExpertRun r = mx_run(l, n, off);
    if (!held_.empty()) r.wgrad = mx_held_wgrad(l, n, off);
    mx_experts_backward(ops_, r, mxw_[l].experts, dye, a.h13, a.we.rows(0, n), s_.dact, s_.dh13, s_.dxe,
                        s_.dwe.rows(0, n), g.w13, g.w2, combine);
    if (!held_.empty() && holds_wgrad()) held_[l][static_cast<size_t>(wgrad_slot())].rows = n;
  } else {
    experts_backward(l, n, off, dye, combine);
  }
  if (overlap) {
    ops_.set_sm_reserve(0);
    ops_.set_exchange_alongside(false);
    TraceScope trace_wait("ep combine (backward, wait)");
    ep_.comm->wait_started();
  }
  trace_experts.reset();
  part.emplace("moe bwd: permute + router + norm + residual");
  // permute backward
  ops_.moe_unpermute(s_.dxp, a.perm, k, s_.dtmp);
  ops_.moe_unpermute_weights(s_.dwp, a.perm, s_.dtopk_w);
  // route backward
  Tensor extra;
  if (aux_on_) {
    ops_.broadcast_rows(s_.aux_coef, s_.dprobs_aux);
    extra = s_.dprobs_aux;
  }
  ops_.router_backward(s_.dtopk_w.view({T_, k_}), a.probs, a.topk_idx, a.topk_w, extra, s_.dlogits);
  ops_.copy(s_.dlogits, s_.dlogits_act);
  linear_dgrad(ops_, s_.dlogits_act, w.gate, s_.dtmp, true);
  linear_wgrad(ops_, s_.dlogits_act, a.moe_in, g.gate);
  if (cfg_.router_jitter_noise > 0) ops_.mul(s_.dtmp, a.noise, s_.dtmp);
  // dtmp is dL/d(ln2): through the norm (tmp as scratch) and added to the residual path's dx.
  ops_.rmsnorm_backward_add(s_.dtmp, a.x_mid, w.ln2, a.rstd2, s_.dx, g.ln2, s_.tmp);
}

}  // namespace mxt
