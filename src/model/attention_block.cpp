// RMSNorm -> QKV -> RoPE -> causal GQA attention -> O projection -> residual, and its backward.
#include <optional>

#include "linear.hpp"
#include "model/mx_linear.hpp"
#include "mxtrain/model.hpp"
#include "mxtrain/trace.hpp"

namespace mxt {

void MixtralModel::attention_forward(int l) {
  LayerActs& a = acts_[l];
  const LayerTensors& w = w_.layers[l];
  const float theta = static_cast<float>(cfg_.rope_theta);
  // Sub-stages for MXTRAIN_STAGE_TIMING (each scope ends where the next begins).
  std::optional<TraceScope> part(std::in_place, "attn: norm");
  ops_.rmsnorm_forward(a.x_in, w.ln1, static_cast<float>(cfg_.rms_norm_eps), a.ln1, a.rstd1);
  part.emplace("attn: qkv projections");
  if (mx_attn_) {  // MXFP8: ln1 quantised once, rowwise for the three projections and columnwise for their
    const MxDense m = mx_dense();  // wgrads (kept in ln1_col: ln1 itself is scratch, s_.mx_ln1)
    const MxRows x = mx_dense_quantize(ops_, m, a.ln1, m.a, a.ln1_col);
    mx_linear_forward(ops_, m, x, mxw_[l].wq, a.q);
    mx_linear_forward(ops_, m, x, mxw_[l].wk, a.k);
    mx_linear_forward(ops_, m, x, mxw_[l].wv, a.v);
  } else {
    linear_forward(ops_, a.ln1, w.wq, a.q);
    linear_forward(ops_, a.ln1, w.wk, a.k);
    linear_forward(ops_, a.ln1, w.wv, a.v);
  }
  const int64_t hd = ashape_.head_dim;
  part.emplace("attn: rope");
  ops_.rope_forward(a.q.view({T_, ashape_.n_heads, hd}), mb_->pos, theta);
  ops_.rope_forward(a.k.view({T_, ashape_.n_kv_heads, hd}), mb_->pos, theta);
  AttnShape shape = ashape_;
  shape.doc_ids = mb_->doc_ids;  // packed rows: no attention across documents
  part.emplace("attn: core");
  ops_.attention_forward(shape, a.q.view({T_, ashape_.n_heads, hd}), a.k.view({T_, ashape_.n_kv_heads, hd}),
                         a.v.view({T_, ashape_.n_kv_heads, hd}), a.attn.view({T_, ashape_.n_heads, hd}), a.lse);
  part.emplace("attn: out projection + residual");
  if (mx_attn_) {
    const MxDense m = mx_dense();
    mx_linear_forward(ops_, m, mx_dense_rowwise(ops_, m, a.attn, m.a), mxw_[l].wo, s_.tmp);
  } else {
    linear_forward(ops_, a.attn, w.wo, s_.tmp);
  }
  ops_.add(a.x_in, s_.tmp, a.x_mid);
}

void MixtralModel::attention_backward(int l) {
  LayerActs& a = acts_[l];
  const LayerTensors& w = w_.layers[l];
  const LayerTensors& g = g_.layers[l];
  const int64_t hd = ashape_.head_dim, H = ashape_.n_heads, KVH = ashape_.n_kv_heads;
  const float theta = static_cast<float>(cfg_.rope_theta);
  // s_.dx holds dL/dx_mid, which flows both into the residual (x_in) and the O projection.
  // MXFP8: the O projection's wgrad quantises attn columnwise here, into scratch c (the attention backward keeps
  // attn anyway; the same bits the forward would have made); the QKV wgrads read ln1_col, made by the forward.
  std::optional<TraceScope> part(std::in_place, "attn bwd: out projection");
  if (mx_attn_) {
    quantize_fp8_colwise(l, true);
    const MxDense m = mx_dense();
    mx_linear_backward(ops_, m, s_.dx, mxw_[l].wo, mx_dense_colwise(ops_, m, a.attn, s_.mx_c), s_.dattn, Tensor(),
                       g.wo);
  } else {
    linear_dgrad(ops_, s_.dx, w.wo, s_.dattn, false);
    linear_wgrad(ops_, s_.dx, a.attn, g.wo);
  }
  AttnShape shape = ashape_;
  shape.doc_ids = mb_->doc_ids;
  part.emplace("attn bwd: core");
  ops_.attention_backward(shape, s_.dattn.view({T_, H, hd}), a.q.view({T_, H, hd}), a.k.view({T_, KVH, hd}),
                          a.v.view({T_, KVH, hd}), a.attn.view({T_, H, hd}), a.lse, s_.dq.view({T_, H, hd}),
                          s_.dk.view({T_, KVH, hd}), s_.dv.view({T_, KVH, hd}));
  part.emplace("attn bwd: rope");
  ops_.rope_backward(s_.dq.view({T_, H, hd}), mb_->pos, theta);
  ops_.rope_backward(s_.dk.view({T_, KVH, hd}), mb_->pos, theta);
  part.emplace("attn bwd: qkv projections");
  if (mx_attn_) {  // dtmp = dq Wq + dk Wk + dv Wv (the last two through tmp, free until the norm below)
    const MxDense m = mx_dense();
    const mxfp8::MxView x = a.ln1_col.view(1, T_, d_, m.fwd, mxfp8::Direction::Columnwise);
    mx_linear_backward(ops_, m, s_.dq, mxw_[l].wq, x, s_.dtmp, Tensor(), g.wq);
    mx_linear_backward(ops_, m, s_.dk, mxw_[l].wk, x, s_.dtmp, s_.tmp, g.wk);
    mx_linear_backward(ops_, m, s_.dv, mxw_[l].wv, x, s_.dtmp, s_.tmp, g.wv);
  } else {
    linear_dgrad(ops_, s_.dq, w.wq, s_.dtmp, false);
    linear_dgrad(ops_, s_.dk, w.wk, s_.dtmp, true);
    linear_dgrad(ops_, s_.dv, w.wv, s_.dtmp, true);
    linear_wgrad(ops_, s_.dq, a.ln1, g.wq);
    linear_wgrad(ops_, s_.dk, a.ln1, g.wk);
    linear_wgrad(ops_, s_.dv, a.ln1, g.wv);
  }
  // dtmp is dL/d(ln1): through the norm (tmp as scratch) and added to the residual path's dx.
  part.emplace("attn bwd: norm + residual");
  ops_.rmsnorm_backward_add(s_.dtmp, a.x_in, w.ln1, a.rstd1, s_.dx, g.ln1, s_.tmp);
}

}  // namespace mxt
