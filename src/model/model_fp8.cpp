// MixtralModel's MXFP8 plumbing (fp8_config.enabled): the buffers, the once-per-step weight quantisation, and
// the per-call descriptions handed to mx_experts / mx_linear.
#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

#include "model/mx_experts.hpp"
#include "model/mx_linear.hpp"
#include "mxtrain/model.hpp"

namespace mxt {

namespace {
void require32(int64_t v, const std::string& what) {
  if (v % mxfp8::kBlock != 0)
    throw std::invalid_argument("fp8_config.enabled=true: " + what + " (" + std::to_string(v) +
                                ") must be a multiple of 32 (MXFP8 blocks of 32 along every GEMM's contraction dim)");
}
}  // namespace

void MixtralModel::plan_fp8() {
  const int64_t hd = cfg_.head_dim(), H = cfg_.num_attention_heads, KVH = cfg_.num_key_value_heads;
  require32(d_, "config_kwargs.hidden_size");
  require32(f_, "config_kwargs.intermediate_size");
  if (mx_attn_) {
    require32(T_, "dataset.micro_batch_size x dataset.max_seq_length (or set fp8_config.keep_attention_bf16=true)");
    require32(KVH * hd, "the key/value projection width config_kwargs.num_key_value_heads x head_dim");
  }
  mx_fwd_ = mxfp8::forward_format(fp8_.fp8_format);
  mx_grad_ = mxfp8::gradient_format(fp8_.fp8_format);
  const DType A = ops_.act_dtype();
  for (size_t l = 0; l < acts_.size(); ++l) {
    const std::string p = "layer" + std::to_string(l) + ".";
    acts_[l].xe_col.plan(arena_, p + "expert_in_mx_col", Cx_ * d_);
    if (recompute_) acts_[l].xe_row.plan(arena_, p + "expert_in_mx_row", Cx_ * d_);
    else acts_[l].act_col.plan(arena_, p + "expert_act_mx_col", Cx_ * f_);
    if (mx_attn_) acts_[l].ln1_col.plan(arena_, p + "ln1_mx_col", T_ * d_);
  }
  if (recompute_) s_.rc_act_col.plan(arena_, "scratch.expert_act_mx_col (recomputed)", Cx_ * f_);
  // The backward's dh13 and the forward-only scratch in one buffer (see Scratch::mx_fwd_bwd).
  int64_t fwd_bwd = std::max(Cx_ * 2 * f_, Cx_ * (f_ + d_));
  if (mx_attn_) fwd_bwd = std::max(fwd_bwd, T_ * d_);
  arena_.add(s_.mx_fwd_bwd, "scratch.dexpert_h13|fwd", A, {fwd_bwd});
  const int64_t room = std::max(Cx_ * std::max(d_, 2 * f_), mx_attn_ ? T_ * std::max(d_, H * hd) : 0);
  s_.mx_a.plan(arena_, "scratch.mx_a", room);
  s_.mx_b.plan(arena_, "scratch.mx_b", room);
  if (mx_bf16_) {
    arena_.add(s_.mx_deq_a, "scratch.mx_deq_a", A, {room});
    arena_.add(s_.mx_deq_b, "scratch.mx_deq_b",
               A, {std::max(Cx_ * std::max(d_, f_), mx_attn_ ? T_ * std::max(d_, H * hd) : 0)});
  }
  if (mx_attn_) {
    s_.mx_c.plan(arena_, "scratch.mx_c", T_ * std::max(d_, H * hd));
    arena_.add(s_.mx_dense_offsets, "scratch.mx_dense_offsets", DType::I32, {2});
  }
  // The weight copies: rowwise always per layer; columnwise per layer too, or (cache_columnwise_weights=false)
  // one shared set in the activation arena, requantised by each layer's backward.
  // hopper_gemm=bf16: the GEMMs read bf16 copies of the values (deq), planned where the codes would be, and the
  // codes are only a staging set (mx_stage_) shared by every layer's quantisation.
  auto plan_layer = [&](LayerMxWeights& q, Arena& arena, const std::string& p, bool row, bool col, bool codes,
                        bool deq) {
    auto one = [&](MxWeight& m, const std::string& name, int64_t b, int64_t r, int64_t c) {
      m.plan(arena, name, b, r, c, row && codes, col && codes);
      if (deq) m.plan_deq(arena, name, A, row, col);
    };
    if (mx_attn_) {
      one(q.wq, p + "wq", 1, H * hd, d_);
      one(q.wk, p + "wk", 1, KVH * hd, d_);
      one(q.wv, p + "wv", 1, KVH * hd, d_);
      one(q.wo, p + "wo", 1, d_, H * hd);
    }
    one(q.experts.w13, p + "experts.w13", El_, 2 * f_, d_);
    one(q.experts.w2, p + "experts.w2", El_, d_, f_);
  };
  const bool cache = fp8_.cache_columnwise_weights;
  mxw_.resize(acts_.size());
  for (size_t l = 0; l < mxw_.size(); ++l)
    plan_layer(mxw_[l], mx_weights_arena_, "layer" + std::to_string(l) + ".", true, cache, !mx_bf16_, mx_bf16_);
  if (!cache) plan_layer(mx_col_, arena_, "scratch.", false, true, !mx_bf16_, mx_bf16_);
  if (mx_bf16_) plan_layer(mx_stage_, arena_, "scratch.mx_stage.", true, true, true, false);
}

void MixtralModel::quantize_fp8_colwise(int l, bool attention) {
  if (fp8_.cache_columnwise_weights) return;
  const LayerTensors& w = w_.layers[l];
  const LayerMxWeights& q = mxw_[l];
  if (attention) {
    for (auto [W, m] : {std::pair{&w.wq, &q.wq}, {&w.wk, &q.wk}, {&w.wv, &q.wv}, {&w.wo, &q.wo}})
      mx_quantize_weight(ops_, *W, *m, false, true);
  } else {
    mx_quantize_weight(ops_, w.w13, q.experts.w13, false, true);
    mx_quantize_weight(ops_, w.w2, q.experts.w2, false, true);
  }
}

// Which of these is live when (one stream, layers in order; every forward of a micro-batch before its backward):
//   mx_ln1   attention_forward: rmsnorm -> its MXFP8 copies (rowwise for QKV, columnwise into ln1_col), then dead
//   mx_xe    moe_forward: permute (or the EP dispatch) -> the experts' input quantisation, then dead
//   mx_act   moe_forward: SwiGLU -> its quantisation, then dead (mx_xe / mx_act: MXFP8 backward reads the copies)
//   dh13     moe_backward only: written by SwiGLU's backward before any read
//   mx_act   also in moe_backward with recompute_experts: SwiGLU's recomputed output -> its columnwise copy, then
//            dead before dh13 is written
// mx_ln1 and mx_xe / mx_act live in different sublayers, so they may overlap too.
void MixtralModel::alias_fp8_scratch() {
  const Tensor& buf = s_.mx_fwd_bwd;
  s_.dh13 = buf.rows(0, Cx_ * 2 * f_).view({Cx_, 2 * f_});
  s_.mx_act = buf.rows(0, Cx_ * f_).view({Cx_, f_});
  s_.mx_xe = buf.rows(Cx_ * f_, Cx_ * d_).view({Cx_, d_});  // at Cx_ * f_ elements (a multiple of 32 * 32)
  if (mx_attn_) s_.mx_ln1 = buf.rows(0, T_ * d_).view({T_, d_});
}

void MixtralModel::quantize_fp8_weights() {
  const bool col = fp8_.cache_columnwise_weights;
  for (size_t l = 0; l < mxw_.size(); ++l) {
    const LayerTensors& w = w_.layers[l];
    const LayerMxWeights& q = mxw_[l];
    mx_quantize_weight(ops_, w.w13, q.experts.w13, true, col);
    mx_quantize_weight(ops_, w.w2, q.experts.w2, true, col);
    if (!mx_attn_) continue;
    mx_quantize_weight(ops_, w.wq, q.wq, true, col);
    mx_quantize_weight(ops_, w.wk, q.wk, true, col);
    mx_quantize_weight(ops_, w.wv, q.wv, true, col);
    mx_quantize_weight(ops_, w.wo, q.wo, true, col);
  }
}

// expert_wgrad_micro_batches > 1 with hopper_gemm=bf16, as the bf16 path does it: a holding micro-batch dequantises
// its columnwise copies into its held buffers (token-major, like bf16's held operands); the group's last one
// contracts every held set and its own in one grouped GEMM. (MXFP8 expert gradients are zeroed each step: adds.)
std::function<void(const mxfp8::MxView&, const mxfp8::MxView&, const Tensor&)> MixtralModel::mx_held_wgrad(
    int l, int64_t n, const Tensor& off) {
  return [this, l, n, off](const mxfp8::MxView& dyc, const mxfp8::MxView& xc, const Tensor& dW) {
    const bool w13 = dW.data == g_.layers[l].w13.data;
    Tensor HeldWgrad::*hdy = w13 ? &HeldWgrad::dh13 : &HeldWgrad::dye;
    Tensor HeldWgrad::*hx = w13 ? &HeldWgrad::xe : &HeldWgrad::act;
    auto flat = [](const Tensor& t) { return t.view({t.numel()}); };
    if (holds_wgrad()) {
      HeldWgrad& h = held_[l][static_cast<size_t>(wgrad_slot())];
      mx_dequantized(ops_, dyc, flat(h.*hdy));
      mx_dequantized(ops_, xc, flat(h.*hx));
      if (!w13) ops_.copy(off, h.offsets);
      return;
    }
    std::vector<Ops::WgradRowSet> sets = held_sets(l, hdy, hx);
    sets.push_back({mx_dequantized(ops_, dyc, s_.mx_deq_a).rows(0, n), mx_dequantized(ops_, xc, s_.mx_deq_b).rows(0, n),
                    off});
    ops_.grouped_gemm_wgrad_sets(sets, dW, true);
  };
}

MxExpertRun MixtralModel::mx_run(int l, int64_t n, const Tensor& offsets) const {
  MxExpertRun r;
  r.n = n;
  r.d = d_;
  r.f = f_;
  r.fwd = mx_fwd_;
  r.grad = mx_grad_;
  r.offsets = offsets;
  r.x_col = acts_[l].xe_col;
  r.act_col = acts_[l].act_col;
  r.x_row = acts_[l].xe_row;
  r.row = s_.mx_a;
  r.col = s_.mx_b;
  r.bf16 = mx_bf16_;
  r.deq_a = s_.mx_deq_a;
  r.deq_b = s_.mx_deq_b;
  return r;
}

MxDense MixtralModel::mx_dense() const {
  MxDense m;
  m.offsets = s_.mx_dense_offsets;
  m.T = T_;
  m.fwd = mx_fwd_;
  m.grad = mx_grad_;
  m.a = s_.mx_a;
  m.b = s_.mx_b;
  m.bf16 = mx_bf16_;
  m.deq_a = s_.mx_deq_a;
  m.deq_b = s_.mx_deq_b;
  return m;
}

}  // namespace mxt
