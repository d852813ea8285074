#pragma once
// fp32 host reference backend: simple, checked loops plus OpenBLAS GEMMs. It is the oracle the CUDA
// backend is tested against, so clarity and exactness win over speed.
#include "mxtrain/ops.hpp"

namespace mxt {

class CpuOps : public Ops {
 public:
  Device device() const override { return Device::CPU; }
  const char* name() const override { return "cpu"; }
  DType act_dtype() const override { return DType::F32; }

  void* alloc(size_t bytes) override;
  void release(void* p) override;
  void upload(void* dst, const void* host_src, size_t bytes) override;
  void download(void* host_dst, const void* src, size_t bytes) override;
  size_t device_free_bytes() const override;  // the host's MemAvailable: this backend's "device" is the host
  void synchronize() override {}

  void zero(const Tensor& t) override;
  void copy(const Tensor& src, const Tensor& dst) override;
  void add(const Tensor& a, const Tensor& b, const Tensor& out) override;
  void mul(const Tensor& a, const Tensor& b, const Tensor& out) override;
  void scale(const Tensor& t, float s) override;
  void sum_squares(const Tensor& t, const Tensor& acc) override;

  void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const Tensor& A,
            const Tensor& B, float beta, const Tensor& C) override;

  void embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& out) override;
  void embedding_backward(const Tensor& ids, const Tensor& dout, const Tensor& dtable) override;

  void rmsnorm_forward(const Tensor& x, const Tensor& w, float eps, const Tensor& y,
                       const Tensor& rstd) override;
  void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                        const Tensor& dx, const Tensor& dw) override;

  void rope_forward(const Tensor& x, const Tensor& pos, float theta) override;
  void rope_backward(const Tensor& dx, const Tensor& pos, float theta) override;

  void attention_forward(const AttnShape& s, const Tensor& q, const Tensor& k, const Tensor& v,
                         const Tensor& out, const Tensor& lse) override;
  void attention_backward(const AttnShape& s, const Tensor& dout, const Tensor& q, const Tensor& k,
                          const Tensor& v, const Tensor& out, const Tensor& lse, const Tensor& dq,
                          const Tensor& dk, const Tensor& dv) override;

  void router_forward(const Tensor& logits, int k, const Tensor& probs, const Tensor& topk_idx,
                      const Tensor& topk_w) override;
  void router_backward(const Tensor& dtopk_w, const Tensor& probs, const Tensor& topk_idx,
                       const Tensor& topk_w, const Tensor& dprobs_extra, const Tensor& dlogits) override;
  void router_aux_stats(const Tensor& probs, const Tensor& topk_idx, const Tensor& prob_sum,
                        const Tensor& count) override;
  void broadcast_rows(const Tensor& coef, const Tensor& dprobs) override;

  void moe_plan(const Tensor& topk_idx, int num_experts, const Tensor& offsets, const Tensor& perm) override;
  void moe_permute(const Tensor& x, const Tensor& perm, int k, const Tensor& xp) override;
  void moe_unpermute(const Tensor& yp, const Tensor& perm, int k, const Tensor& out) override;
  void moe_permute_weights(const Tensor& w, const Tensor& perm, const Tensor& wp) override;
  void moe_unpermute_weights(const Tensor& dwp, const Tensor& perm, const Tensor& dw) override;

  void grouped_gemm(const Tensor& x, const Tensor& W, const Tensor& offsets, const Tensor& y) override;
  void grouped_gemm_dgrad(const Tensor& dy, const Tensor& W, const Tensor& offsets, const Tensor& dx) override;
  void grouped_gemm_wgrad(const Tensor& dy, const Tensor& x, const Tensor& offsets, const Tensor& dW) override;

  void mx_quantize(const Tensor& x, const mxfp8::MxView* rowwise, const mxfp8::MxView* colwise) override;
  void mx_dequantize(const mxfp8::MxView& q, const Tensor& out) override;
  void mx_quantize_values(const Tensor& x, mxfp8::Format row_format, const Tensor& row_values,
                          const mxfp8::MxView* colwise) override;
  void mx_grouped_gemm(const mxfp8::MxView& A, const mxfp8::MxView& B, const Tensor& offsets,
                       const Tensor& C) override;
  void mx_grouped_gemm_wgrad(const mxfp8::MxView& A, const mxfp8::MxView& B, const Tensor& offsets,
                             const Tensor& C) override;

  void swiglu_forward(const Tensor& h13, const Tensor& wp, const Tensor& a) override;
  void swiglu_backward(const Tensor& da, const Tensor& h13, const Tensor& wp, const Tensor& dh13,
                       const Tensor& dwp) override;

  void lm_head_loss(const Tensor& h, const Tensor& W, const Tensor& labels, float grad_scale,
                    const Tensor& loss_sum, const Tensor& dh, const Tensor& dW,
                    const Tensor& dlogits = Tensor()) override;

  void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                  const AdamWStep& s) override;
};

}  // namespace mxt
