// RMSNorm -> QKV -> RoPE -> causal GQA attention -> O projection -> residual, and its backward.
#include "linear.hpp"
#include "mxtrain/model.hpp"

namespace mxt {

void MixtralModel::attention_forward(int l) {
  LayerActs& a = acts_[l];
  const LayerTensors& w = w_.layers[l];
  const float theta = static_cast<float>(cfg_.rope_theta);
  ops_.rmsnorm_forward(a.x_in, w.ln1, static_cast<float>(cfg_.rms_norm_eps), a.ln1, a.rstd1);
  linear_forward(ops_, a.ln1, w.wq, a.q);
  linear_forward(ops_, a.ln1, w.wk, a.k);
  linear_forward(ops_, a.ln1, w.wv, a.v);
  const int64_t hd = ashape_.head_dim;
  ops_.rope_forward(a.q.view({T_, ashape_.n_heads, hd}), mb_->pos, theta);
  ops_.rope_forward(a.k.view({T_, ashape_.n_kv_heads, hd}), mb_->pos, theta);
  AttnShape shape = ashape_;
  shape.doc_ids = mb_->doc_ids;  // packed rows: no attention across documents
  ops_.attention_forward(shape, a.q.view({T_, ashape_.n_heads, hd}), a.k.view({T_, ashape_.n_kv_heads, hd}),
                         a.v.view({T_, ashape_.n_kv_heads, hd}), a.attn.view({T_, ashape_.n_heads, hd}), a.lse);
  linear_forward(ops_, a.attn, w.wo, s_.tmp);
  ops_.add(a.x_in, s_.tmp, a.x_mid);
}

void MixtralModel::attention_backward(int l) {
  LayerActs& a = acts_[l];
  const LayerTensors& w = w_.layers[l];
  const LayerTensors& g = g_.layers[l];
  const int64_t hd = ashape_.head_dim, H = ashape_.n_heads, KVH = ashape_.n_kv_heads;
  const float theta = static_cast<float>(cfg_.rope_theta);
  // s_.dx holds dL/dx_mid, which flows both into the residual (x_in) and the O projection.
  linear_dgrad(ops_, s_.dx, w.wo, s_.dattn, false);
  linear_wgrad(ops_, s_.dx, a.attn, g.wo);
  AttnShape shape = ashape_;
  shape.doc_ids = mb_->doc_ids;
  ops_.attention_backward(shape, s_.dattn.view({T_, H, hd}), a.q.view({T_, H, hd}), a.k.view({T_, KVH, hd}),
                          a.v.view({T_, KVH, hd}), a.attn.view({T_, H, hd}), a.lse, s_.dq.view({T_, H, hd}),
                          s_.dk.view({T_, KVH, hd}), s_.dv.view({T_, KVH, hd}));
  ops_.rope_backward(s_.dq.view({T_, H, hd}), mb_->pos, theta);
  ops_.rope_backward(s_.dk.view({T_, KVH, hd}), mb_->pos, theta);
  linear_dgrad(ops_, s_.dq, w.wq, s_.dtmp, false);
  linear_dgrad(ops_, s_.dk, w.wk, s_.dtmp, true);
  linear_dgrad(ops_, s_.dv, w.wv, s_.dtmp, true);
  linear_wgrad(ops_, s_.dq, a.ln1, g.wq);
  linear_wgrad(ops_, s_.dk, a.ln1, g.wk);
  linear_wgrad(ops_, s_.dv, a.ln1, g.wv);
  // dtmp is dL/d(ln1); reuse tmp for dL/dx_in through the norm, then add the residual path.
  ops_.rmsnorm_backward(s_.dtmp, a.x_in, w.ln1, a.rstd1, s_.tmp, g.ln1);
  ops_.add(s_.dx, s_.tmp, s_.dx);
}

}  // namespace mxt
