#pragma once
// backend=cuda-fp32: the CUDA backend with fp32 activations and working weights, for checking numerics against
// an fp32 reference (HF transformers in fp32, the CPU backend) on shapes too large for the CPU. The ops whose
// operands are activations get plain fp32 kernels here (one thread per output value or row, sums in fp32 or
// fp64 as the CPU twin sums them, no tensor cores, no TF32); everything else (router, plans, optimizer, the
// dense GEMMs through cuBLASLt with fp32 operands and CUBLAS_COMPUTE_32F) is CudaOps's. Correct, not fast: the
// bf16 CudaOps is the training backend. No MXFP8: its GEMMs are the bf16 backend's.
#include "cuda_ops.hpp"

namespace mxt {

class CudaF32Ops : public CudaOps {
 public:
  explicit CudaF32Ops(int device = 0) : CudaOps(device) {}

  const char* name() const override { return "cuda-fp32"; }
  DType act_dtype() const override { return DType::F32; }

  void embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& out) override;
  void embedding_backward(const Tensor& ids, const Tensor& dout, const Tensor& dtable) override;

  void rmsnorm_forward(const Tensor& x, const Tensor& w, float eps, const Tensor& y, const Tensor& rstd) override;
  void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dx,
                        const Tensor& dw) override;

  void rope_forward(const Tensor& x, const Tensor& pos, float theta) override;
  void rope_backward(const Tensor& dx, const Tensor& pos, float theta) override;

  void attention_forward(const AttnShape& s, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                         const Tensor& lse) override;
  void attention_backward(const AttnShape& s, const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                          const Tensor& out, const Tensor& lse, const Tensor& dq, const Tensor& dk,
                          const Tensor& dv) override;

  void moe_permute(const Tensor& x, const Tensor& perm, int k, const Tensor& xp) override;
  void moe_unpermute(const Tensor& yp, const Tensor& perm, int k, const Tensor& out) override;

  void grouped_gemm(const Tensor& x, const Tensor& W, const Tensor& offsets, const Tensor& y) override;
  void grouped_gemm_dgrad(const Tensor& dy, const Tensor& W, const Tensor& offsets, const Tensor& dx) override;
  void grouped_gemm_wgrad(const Tensor& dy, const Tensor& x, const Tensor& offsets, const Tensor& dW) override;
  // The interface's compositions of the ops above (CudaOps fuses them in its bf16 kernels).
  void grouped_gemm_wgrad_sets(const std::vector<WgradRowSet>& sets, const Tensor& dW, bool accumulate) override {
    Ops::grouped_gemm_wgrad_sets(sets, dW, accumulate);
  }
  bool sums_wgrad_norm() const override { return false; }
  void grouped_gemm_wgrad_sets_norm(const std::vector<WgradRowSet>& sets, const Tensor& dW,
                                    const Tensor& acc) override {
    Ops::grouped_gemm_wgrad_sets_norm(sets, dW, acc);
  }
  void grouped_gemm_swiglu(const Tensor& x, const Tensor& W13, const Tensor& offsets, const Tensor& wp,
                           const Tensor& h13, const Tensor& a) override {
    Ops::grouped_gemm_swiglu(x, W13, offsets, wp, h13, a);
  }
  void grouped_gemm_dgrad_swiglu(const Tensor& dy, const Tensor& W2, const Tensor& offsets, const Tensor& h13,
                                 const Tensor& wp, const Tensor& dact, const Tensor& dh13,
                                 const Tensor& dwp) override {
    Ops::grouped_gemm_dgrad_swiglu(dy, W2, offsets, h13, wp, dact, dh13, dwp);
  }

  void swiglu_forward(const Tensor& h13, const Tensor& wp, const Tensor& a) override;
  void swiglu_backward(const Tensor& da, const Tensor& h13, const Tensor& wp, const Tensor& dh13,
                       const Tensor& dwp) override;

  void lm_head_loss(const Tensor& h, const Tensor& W, const Tensor& labels, float grad_scale, const Tensor& loss_sum,
                    const Tensor& dh, const Tensor& dW, const Tensor& dlogits = Tensor()) override;

  void mx_quantize(const Tensor&, const mxfp8::MxView*, const mxfp8::MxView*) override { no_mx("mx_quantize"); }
  void mx_dequantize(const mxfp8::MxView&, const Tensor&) override { no_mx("mx_dequantize"); }
  void mx_quantize_values(const Tensor&, mxfp8::Format, const Tensor&, const mxfp8::MxView*) override {
    no_mx("mx_quantize_values");
  }
  void mx_grouped_gemm(const mxfp8::MxView&, const mxfp8::MxView&, const Tensor&, const Tensor&) override {
    no_mx("mx_grouped_gemm");
  }
  void mx_grouped_gemm_wgrad(const mxfp8::MxView&, const mxfp8::MxView&, const Tensor&, const Tensor&) override {
    no_mx("mx_grouped_gemm_wgrad");
  }
  void mx_gemm(const mxfp8::MxView&, const mxfp8::MxView&, const Tensor&, const Tensor&) override { no_mx("mx_gemm"); }
  void mx_gemm_wgrad(const mxfp8::MxView&, const mxfp8::MxView&, const Tensor&, const Tensor&) override {
    no_mx("mx_gemm_wgrad");
  }

 private:
  [[noreturn]] static void no_mx(const char* op);
};

std::unique_ptr<Ops> make_cuda_f32_ops(int device = 0);

}  // namespace mxt
