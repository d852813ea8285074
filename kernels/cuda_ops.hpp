#pragma once
// CUDA backend: bf16 activations and working weights, fp32 master weights / gradients / optimizer state /
// routing statistics, fp32 accumulation everywhere. Every method runs on the backend's stream and never
// synchronises with the host (except download/synchronize).
//
// Dtype contract (see ops.hpp for shapes):
//   gemm                 A, B BF16; C BF16 or F32 (F32 for weight gradients, beta=1 accumulates); or all F32
//                        (CudaF32Ops, kernels/fp32)
//   embedding            table BF16 -> out BF16; backward dout BF16 -> dtable F32 (accumulate)
//   rmsnorm              x, w BF16 -> y BF16, rstd F32; backward dy BF16 -> dx BF16, dw F32 (accumulate)
//   rope                 BF16 in place, angles in fp32
//   attention            q, k, v, out, dout, dq, dk, dv BF16; lse F32
//   router_*, broadcast  F32 (logits, probs, topk_w, grads), I32 indices
//   moe_plan, perm       I32; moe_permute / unpermute BF16 rows (sums in fp32); *_weights F32
//   grouped_gemm         x, W BF16 -> y BF16; dgrad BF16; wgrad dW F32 (accumulate)
//   mx_*                 quantise BF16 (or F32) x; GEMM C BF16 (or F32); wgrad C F32 (accumulate); I32 offsets
//                        on the device (kernels/mxfp8_cuda.hpp does the work)
//   swiglu               h13, a, da, dh13 BF16; wp, dwp F32
//   lm_head_loss         h, W, dh, dlogits BF16; labels I32; loss_sum F32; dW F32 (accumulate)
//   adamw_step           all F32 (adamw_step_to: working BF16 or F32)
//   zero/copy/add/mul/scale: any float dtype (copy converts F32 <-> BF16); sum_squares: F32 or BF16 in, F32 acc
#include <cstddef>
#include <string>
#include <unordered_map>
#include <vector>

#include "mxtrain/ops.hpp"

namespace mxt {

struct CudaContext;  // stream, cuBLASLt handle and workspace (cuda_context.cuh)

class CudaOps : public Ops {
 public:
  explicit CudaOps(int device = 0);
  ~CudaOps() override;
  CudaContext& ctx() { return *ctx_; }

  Device device() const override { return Device::CUDA; }
  const char* name() const override { return "cuda"; }
  DType act_dtype() const override { return DType::BF16; }

  void* alloc(size_t bytes) override;
  void release(void* p) override;
  void upload(void* dst, const void* host_src, size_t bytes) override;
  void upload_async(void* dst, const void* host_src, size_t bytes) override;
  bool graphs_supported() const override { return true; }
  size_t device_free_bytes() const override;
  void capture_begin() override;
  void* capture_end(std::string* why) override;
  void graph_launch(void* graph) override;
  void graph_destroy(void* graph) override;
  void download(void* host_dst, const void* src, size_t bytes) override;
  void download_overlapped(void* host_dst, const void* src, size_t bytes,
                           const std::function<void()>& meanwhile) override;
  void synchronize() override;
  size_t peak_allocated() const override;
  void set_sm_reserve(int sms) override;
  void set_exchange_alongside(bool on) override;
  void set_lm_head_chunk_tokens(int64_t tokens) override { lm_head_chunk_ = tokens; }

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
  void rmsnorm_backward_add(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                            const Tensor& dx_acc, const Tensor& dw, const Tensor& tmp) override;

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
  void moe_unpermute_add(const Tensor& yp, const Tensor& perm, int k, const Tensor& res, const Tensor& out,
                         const Tensor& tmp) override;
  void moe_permute_weights(const Tensor& w, const Tensor& perm, const Tensor& wp) override;
  void moe_unpermute_weights(const Tensor& dwp, const Tensor& perm, const Tensor& dw) override;

  void grouped_gemm(const Tensor& x, const Tensor& W, const Tensor& offsets, const Tensor& y) override;
  void grouped_gemm_dgrad(const Tensor& dy, const Tensor& W, const Tensor& offsets, const Tensor& dx) override;
  void grouped_gemm_wgrad(const Tensor& dy, const Tensor& x, const Tensor& offsets, const Tensor& dW) override;
  void grouped_gemm_wgrad_sets(const std::vector<WgradRowSet>& sets, const Tensor& dW, bool accumulate) override;
  bool sums_wgrad_norm() const override { return true; }
  void grouped_gemm_wgrad_sets_norm(const std::vector<WgradRowSet>& sets, const Tensor& dW,
                                    const Tensor& acc) override;

  void mx_quantize(const Tensor& x, const mxfp8::MxView* rowwise, const mxfp8::MxView* colwise) override;
  void mx_dequantize(const mxfp8::MxView& q, const Tensor& out) override;
  void mx_quantize_values(const Tensor& x, mxfp8::Format row_format, const Tensor& row_values,
                          const mxfp8::MxView* colwise) override;
  void mx_grouped_gemm(const mxfp8::MxView& A, const mxfp8::MxView& B, const Tensor& offsets,
                       const Tensor& C) override;
  void mx_grouped_gemm_wgrad(const mxfp8::MxView& A, const mxfp8::MxView& B, const Tensor& offsets,
                             const Tensor& C) override;
  void mx_gemm(const mxfp8::MxView& A, const mxfp8::MxView& B, const Tensor& all_rows, const Tensor& C) override;
  void mx_gemm_wgrad(const mxfp8::MxView& A, const mxfp8::MxView& B, const Tensor& all_k, const Tensor& C) override;

  void swiglu_forward(const Tensor& h13, const Tensor& wp, const Tensor& a) override;
  void grouped_gemm_swiglu(const Tensor& x, const Tensor& W13, const Tensor& offsets, const Tensor& wp,
                           const Tensor& h13, const Tensor& a) override;
  void grouped_gemm_dgrad_swiglu(const Tensor& dy, const Tensor& W2, const Tensor& offsets, const Tensor& h13,
                                 const Tensor& wp, const Tensor& dact, const Tensor& dh13, const Tensor& dwp) override;
  void swiglu_backward(const Tensor& da, const Tensor& h13, const Tensor& wp, const Tensor& dh13,
                       const Tensor& dwp) override;

  void lm_head_loss(const Tensor& h, const Tensor& W, const Tensor& labels, float grad_scale,
                    const Tensor& loss_sum, const Tensor& dh, const Tensor& dW,
                    const Tensor& dlogits = Tensor()) override;

  void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                  const AdamWStep& s) override;
  void adamw_step_to(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, const AdamWStep& s,
                     const Tensor& working) override;
  void adamw_step_split(const Tensor& hi, const Tensor& rem, const Tensor& grad, const Tensor& m, const Tensor& v,
                        const AdamWStep& s) override;

 protected:  // CudaF32Ops (kernels/fp32) reuses the stream, scratch, LM-head chunk and argument checks
  // lm_head_loss's shape checks (ops.hpp's contract), for either activation dtype.
  struct LmHeadDims {
    int64_t T, V, d;
    bool grad, keep;  // dh given; dlogits given (the caller contracts dW)
  };
  static LmHeadDims check_lm_head(const char* op, const Tensor& h, const Tensor& W, const Tensor& labels,
                                  const Tensor& loss_sum, const Tensor& dh, const Tensor& dW, const Tensor& dlogits);

  // grouped_gemm_wgrad_sets storing a bf16 dW one expert at a time, where the sm90 kernel does not; acc: the norm.
  void wgrad_sets_bf16_by_expert(const std::vector<WgradRowSet>& sets, const Tensor& dW, const Tensor* acc);

  // acc[0] += sum(x[0..n)), in fp64 and in a fixed order: the clipping norm's per-tile partial sums of squares.
  void sum_values(const float* x, int64_t n, float* acc, const char* op);

  CudaContext* ctx_;
  std::unordered_map<void*, size_t> sizes_;  // live allocations, for the memory report
  int64_t lm_head_chunk_ = 4096;              // set_lm_head_chunk_tokens
};

// One of cuBLASLt's heuristic algorithms for a gemm problem (rank 0 is the one CudaOps::gemm runs) and its
// median time over the timed runs.
struct GemmCandidate {
  int rank;
  float ms;
  std::string config;  // algorithm id, tile, stages, split-k, swizzle, cluster
};

// Times the heuristic's first max_algos algorithms for gemm(trans_a, trans_b, M, N, K, alpha, A, B, beta, C),
// each warm-up + `reps` runs, synchronising: C is written 1 + reps times per algorithm, so beta must be 0 or C
// a scratch copy. For benchmarks (bench_gemm_algos), not for the training step.
std::vector<GemmCandidate> gemm_candidates(CudaOps& ops, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                                           float alpha, const Tensor& A, const Tensor& B, float beta,
                                           const Tensor& C, int max_algos, int reps);

// Throws std::runtime_error when no CUDA device is usable.
std::unique_ptr<Ops> make_cuda_ops(int device = 0);

}  // namespace mxt
