#pragma once
// The op interface: every piece of math the model and trainer need, with forward and backward side by side.
// Implementations: CpuOps (fp32 reference, the oracle for tests) and, later, CudaOps (bf16 storage, fp32
// accumulation). Model and trainer code is written once against this interface.
//
// Conventions
// - Row-major. Activations are [T, ...] with T = batch * seq tokens, token t = b * seq + s.
// - Linear weights use HF's [out, in] layout: y = x W^T.
// - "overwrite" outputs are fully written; "accumulate" outputs are added into (gradients of weights).
// - Integer index tensors are I32. Routing / softmax statistics are always F32.
// - Scalars that the host may want (loss, squared norms) are accumulated into small device tensors so that
//   a device backend never has to synchronise inside the step.
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "mxtrain/tensor.hpp"

namespace mxt {

namespace mxfp8 {
struct MxView;  // mxtrain/mxfp8.hpp
enum class Format : uint8_t;
}

struct AttnShape {
  int64_t batch = 0, seq = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;
  Tensor doc_ids;  // (T) I32 document of each token for packed rows; empty: plain causal
};

struct AdamWStep {
  float lr = 0.f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.f;
  int64_t step = 1;        // 1-based, for bias correction
  float grad_scale = 1.f;  // multiplies the gradient first (global-norm clipping coefficient)
};

// Rows per LM-head chunk for T tokens when at most `tokens` may have logits at once (a multiple of 64 when the
// chunk is smaller than T, for the GEMMs). The CUDA lm_head_loss and the memory plan both use it.
inline int64_t lm_head_chunk_rows(int64_t T, int64_t tokens) {
  int64_t c = tokens < T ? tokens : T;
  if (c >= 128 && c < T) c -= c % 64;
  return c < 1 ? 1 : c;
}

class Ops {
 public:
  virtual ~Ops() = default;
  virtual Device device() const = 0;
  virtual const char* name() const = 0;
  // The dtype of activations, their gradients and the working copy of the weights (CPU: F32, CUDA: BF16).
  // Master weights, weight gradients, optimizer state and routing / softmax statistics are always F32.
  virtual DType act_dtype() const = 0;

  // ---- memory -------------------------------------------------------------------------------------
  virtual void* alloc(size_t bytes) = 0;  // zero-filled
  virtual void release(void* p) = 0;
  virtual void upload(void* dst, const void* host_src, size_t bytes) = 0;
  // The same without waiting for the device: the host buffer may be reused at once, the copy runs in stream
  // order (after the work already enqueued). The trainer's per-micro-batch inputs, so the host never waits for
  // the previous micro-batch to finish.
  virtual void upload_async(void* dst, const void* host_src, size_t bytes) { upload(dst, host_src, bytes); }
  virtual void download(void* host_dst, const void* src, size_t bytes) = 0;
  // download, but the device goes on with the work `meanwhile` (may be empty) enqueues (not writing src) while the host
  // waits for the copy: the host blocks only until the copy itself is done, not the work queued after it.
  virtual void download_overlapped(void* host_dst, const void* src, size_t bytes,
                                   const std::function<void()>& meanwhile) {
    download(host_dst, src, bytes);
    if (meanwhile) meanwhile();
  }
  // Free device memory now, in bytes (0: not a device backend, nothing to check against).
  virtual size_t device_free_bytes() const { return 0; }
  // Graphs (CUDA graphs; backends without them return false / nullptr): between capture_begin and capture_end
  // the ops this thread enqueues are recorded, not run; capture_end returns a replayable graph, or nullptr when
  // the capture failed (an op that cannot be captured), with *why set. graph_launch enqueues one replay.
  virtual bool graphs_supported() const { return false; }
  virtual void capture_begin() {}
  virtual void* capture_end(std::string* /*why*/) { return nullptr; }
  virtual void graph_launch(void* /*graph*/) {}
  virtual void graph_destroy(void* /*graph*/) {}
  virtual void synchronize() = 0;
  // Most bytes this backend has held at once through alloc and its own scratch (0: not tracked).
  virtual size_t peak_allocated() const { return 0; }
  // Multiprocessors the persistent GEMM kernels leave free for a collective running alongside them (0: none).
  virtual void set_sm_reserve(int /*sms*/) {}
  // Whether an exchange (a collective on another stream) may run beside the kernels queued from now on: scheduling
  // that counts on every one of a kernel's CTAs being resident (the weight gradient's lockstep) then steps aside.
  virtual void set_exchange_alongside(bool /*on*/) {}
  // At most this many tokens' LM-head logits at once in lm_head_loss (the backends that chunk it; the chunk is
  // lm_head_chunk_rows(T, tokens)).
  virtual void set_lm_head_chunk_tokens(int64_t /*tokens*/) {}

  // ---- elementwise --------------------------------------------------------------------------------
  virtual void zero(const Tensor& t) = 0;
  virtual void copy(const Tensor& src, const Tensor& dst) = 0;  // equal numel; converts dtype
  virtual void add(const Tensor& a, const Tensor& b, const Tensor& out) = 0;  // out may alias a or b
  virtual void mul(const Tensor& a, const Tensor& b, const Tensor& out) = 0;  // out may alias a or b
  virtual void scale(const Tensor& t, float s) = 0;                           // in place
  // acc[0] += sum(t^2), computed in fp64 and stored in F32 acc.
  virtual void sum_squares(const Tensor& t, const Tensor& acc) = 0;

  // ---- dense GEMM ---------------------------------------------------------------------------------
  // C[M,N] = alpha * op(A) @ op(B) + beta * C. A is [M,K] ([K,M] if trans_a); B is [K,N] ([N,K] if trans_b).
  virtual void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                    const Tensor& A, const Tensor& B, float beta, const Tensor& C) = 0;

  // ---- embedding ----------------------------------------------------------------------------------
  // out[t,:] = table[ids[t],:]                       ids [T] I32, table [V,d], out [T,d] (overwrite)
  virtual void embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& out) = 0;
  // dtable[ids[t],:] += dout[t,:]                    dtable [V,d] (accumulate)
  virtual void embedding_backward(const Tensor& ids, const Tensor& dout, const Tensor& dtable) = 0;

  // ---- RMSNorm (HF: fp32 x * rsqrt(mean(x^2) + eps), then * weight) ----------------------------------
  // x [T,d], w [d] -> y [T,d] (overwrite), rstd [T] F32 (overwrite, saved for backward)
  virtual void rmsnorm_forward(const Tensor& x, const Tensor& w, float eps, const Tensor& y,
                               const Tensor& rstd) = 0;
  // dx [T,d] (overwrite), dw [d] (accumulate)
  virtual void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                                const Tensor& dx, const Tensor& dw) = 0;
  // The backward with the residual path's gradient added: dx_acc = dx_acc + dx (dx rounded first, exactly
  // rmsnorm_backward into tmp then add(dx_acc, tmp, dx_acc), which is what this default does; a backend may fuse
  // the two, tmp [T,d] then unused).
  virtual void rmsnorm_backward_add(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                                    const Tensor& dx_acc, const Tensor& dw, const Tensor& tmp) {
    rmsnorm_backward(dy, x, w, rstd, tmp, dw);
    add(dx_acc, tmp, dx_acc);
  }

  // ---- RoPE, HF rotate_half convention, in place ---------------------------------------------------
  // x [T, n_heads, head_dim]; pos [T] I32. For i < h = head_dim/2, f_i = theta^(-2i/head_dim), a = pos*f_i:
  //   x'[i] = x[i] cos a - x[i+h] sin a;  x'[i+h] = x[i+h] cos a + x[i] sin a
  virtual void rope_forward(const Tensor& x, const Tensor& pos, float theta) = 0;
  // The transpose (inverse) rotation applied to the gradient, in place.
  virtual void rope_backward(const Tensor& dx, const Tensor& pos, float theta) = 0;

  // ---- causal GQA attention, scale 1/sqrt(head_dim) -----------------------------------------------
  // q [T,H,D], k,v [T,KVH,D], query head h reads kv head h / (H/KVH) (HF repeat_kv).
  // out [T,H,D] (overwrite); lse [B,H,S] F32 log-sum-exp of the scaled scores (saved for backward).
  virtual void attention_forward(const AttnShape& s, const Tensor& q, const Tensor& k, const Tensor& v,
                                 const Tensor& out, const Tensor& lse) = 0;
  // dq, dk, dv (overwrite)
  virtual void attention_backward(const AttnShape& s, const Tensor& dout, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const Tensor& out, const Tensor& lse, const Tensor& dq,
                                  const Tensor& dk, const Tensor& dv) = 0;

  // ---- router: softmax over all experts (fp32), top-k, renormalise --------------------------------
  // logits [T,E] F32 -> probs [T,E] F32, topk_idx [T,k] I32 (descending prob, ties to the lower index),
  // topk_w [T,k] F32 (renormalised to sum 1). All overwrite.
  virtual void router_forward(const Tensor& logits, int k, const Tensor& probs, const Tensor& topk_idx,
                              const Tensor& topk_w) = 0;
  // dtopk_w [T,k]; dprobs_extra [T,E] is an extra gradient on probs (aux loss) or an empty Tensor.
  // dlogits [T,E] F32 (overwrite).
  virtual void router_backward(const Tensor& dtopk_w, const Tensor& probs, const Tensor& topk_idx,
                               const Tensor& topk_w, const Tensor& dprobs_extra, const Tensor& dlogits) = 0;
  // Load-balancing statistics over experts: prob_sum[e] += sum_t probs[t,e]; count[e] += #(t,j) with
  // topk_idx[t,j] == e. Both [E] F32 (accumulate).
  virtual void router_aux_stats(const Tensor& probs, const Tensor& topk_idx, const Tensor& prob_sum,
                                const Tensor& count) = 0;
  // dprobs[t,e] = coef[e] for every t (overwrite). coef [E] F32, dprobs [T,E] F32.
  virtual void broadcast_rows(const Tensor& coef, const Tensor& dprobs) = 0;

  // ---- MoE permutation ----------------------------------------------------------------------------
  // From topk_idx [T,k]: offsets [E+1] I32 (rows of expert e are [offsets[e], offsets[e+1])) and
  // perm [T*k] I32: permuted row p holds slot perm[p] = t*k + j. Within an expert, slots ascend.
  virtual void moe_plan(const Tensor& topk_idx, int num_experts, const Tensor& offsets,
                        const Tensor& perm) = 0;
  // xp[p,:] = x[perm[p] / k,:]          x [T,d], xp [T*k,d] (overwrite)
  virtual void moe_permute(const Tensor& x, const Tensor& perm, int k, const Tensor& xp) = 0;
  // out[t,:] = sum_{p: perm[p]/k == t} yp[p,:]   (overwrite). Also the backward of moe_permute.
  virtual void moe_unpermute(const Tensor& yp, const Tensor& perm, int k, const Tensor& out) = 0;
  // out = res + moe_unpermute(yp) (the unpermuted sum rounded first: moe_unpermute into tmp then add(res, tmp,
  // out), this default; a backend may fuse them, tmp [T,d] then unused). out may alias res.
  virtual void moe_unpermute_add(const Tensor& yp, const Tensor& perm, int k, const Tensor& res, const Tensor& out,
                                 const Tensor& tmp) {
    moe_unpermute(yp, perm, k, tmp);
    add(res, tmp, out);
  }
  // wp[p] = w[perm[p]]  (w [T*k] F32 flat)           and its backward dw[perm[p]] = dwp[p] (overwrite).
  virtual void moe_permute_weights(const Tensor& w, const Tensor& perm, const Tensor& wp) = 0;
  virtual void moe_unpermute_weights(const Tensor& dwp, const Tensor& perm, const Tensor& dw) = 0;

  // ---- grouped expert GEMMs over rows grouped by expert (offsets [E+1]) ---------------------------------
  // offsets[0] = 0, non-decreasing, offsets[E] <= R: rows past offsets[E] are capacity padding and come out
  // as zeros (a device backend sizes buffers for the worst case without reading the counts on the host).
  // y[r,:] = x[r,:] @ W[e]^T for r in expert e.   x [R,in], W [E,out,in], y [R,out] (overwrite)
  virtual void grouped_gemm(const Tensor& x, const Tensor& W, const Tensor& offsets, const Tensor& y) = 0;
  // dx[r,:] = dy[r,:] @ W[e]                       dx [R,in] (overwrite)
  virtual void grouped_gemm_dgrad(const Tensor& dy, const Tensor& W, const Tensor& offsets,
                                  const Tensor& dx) = 0;
  // dW[e] += dy_e^T @ x_e                          dW [E,out,in] (accumulate)
  virtual void grouped_gemm_wgrad(const Tensor& dy, const Tensor& x, const Tensor& offsets,
                                  const Tensor& dW) = 0;
  // The weight gradient over several row sets (e.g. micro-batches) into one pass over dW: dW[e] += (accumulate)
  // or = (not; an expert without rows gets zeros) the sets' dy_e^T @ x_e summed in order. Equal to the single
  // calls up to fp32 summation order; by default it is those calls (after zeroing dW when not accumulating).
  struct WgradRowSet {
    Tensor dy, x, offsets;
  };
  virtual void grouped_gemm_wgrad_sets(const std::vector<WgradRowSet>& sets, const Tensor& dW, bool accumulate) {
    if (!accumulate) zero(dW);
    for (const WgradRowSet& r : sets) grouped_gemm_wgrad(r.dy, r.x, r.offsets, dW);
  }
  // grouped_gemm_wgrad_sets storing dW (not accumulating), and acc[0] += sum(dW^2) (F32 acc) for the clipping
  // norm. CudaOps sums the squares in the GEMM's epilogue, from the values it stores, instead of reading dW back;
  // sums_wgrad_norm says whether this backend does (else the trainer keeps its one pass over all gradients).
  virtual bool sums_wgrad_norm() const { return false; }
  virtual void grouped_gemm_wgrad_sets_norm(const std::vector<WgradRowSet>& sets, const Tensor& dW,
                                            const Tensor& acc) {
    grouped_gemm_wgrad_sets(sets, dW, false);
    sum_squares(dW, acc);
  }

  // ---- MXFP8 (fp8_config.enabled; formats, layouts and operand directions: mxtrain/mxfp8.hpp) ----------
  // Quantises x ([rows, cols] or [batch, rows, cols], act dtype) into the rowwise and / or columnwise copy
  // (views of x's shape on this backend's device; either may be null, not both) in one pass over x.
  virtual void mx_quantize(const Tensor& x, const mxfp8::MxView* rowwise, const mxfp8::MxView* colwise) = 0;
  // out = the copy's values (codes x block scales) in x's logical layout [batch, rows, cols], act dtype: exact
  // (bf16 holds every E4M3 / E5M2 value times a scale, down to 2^-133). fp8_config.hopper_gemm=bf16 runs the
  // MXFP8 GEMMs as bf16 GEMMs on these.
  virtual void mx_dequantize(const mxfp8::MxView& q, const Tensor& out) = 0;
  // Both at once for the rowwise copy: row_values (x's layout, act dtype) = mx_dequantize of the rowwise copy
  // mx_quantize would make in row_format, without writing its codes; colwise (may be null) as in mx_quantize,
  // from the same pass over x. hopper_gemm=bf16 reads an activation's rowwise copy only as values.
  virtual void mx_quantize_values(const Tensor& x, mxfp8::Format row_format, const Tensor& row_values,
                                  const mxfp8::MxView* colwise) = 0;
  // Grouped along M (forward, dgrad; a dense linear is one group with offsets {0, rows}): A [M, K] (batch 1)
  // and B [E][N, K] K-major; rows m in [offsets[e], offsets[e+1]) use B's group e. C [M, N] act dtype
  // (overwrite; rows past offsets[E] zeroed).
  virtual void mx_grouped_gemm(const mxfp8::MxView& A, const mxfp8::MxView& B, const Tensor& offsets,
                               const Tensor& C) = 0;
  // Grouped along K (wgrad): A [M, K], B [N, K] (batch 1); C [E, M, N] F32 += the sum over k in
  // [offsets[e], offsets[e+1]) of A(:, k) B(:, k)^T. Group boundaries may fall inside a 32-block.
  virtual void mx_grouped_gemm_wgrad(const mxfp8::MxView& A, const mxfp8::MxView& B, const Tensor& offsets,
                                     const Tensor& C) = 0;
  // The dense MXFP8 linears: the two above with one group over every row, offsets {0, A's rows} (forward, dgrad)
  // or {0, K} (wgrad), which the caller guarantees; a device backend may run a dense kernel that never reads
  // them (Blackwell's block-scaled cuBLASLt GEMM).
  virtual void mx_gemm(const mxfp8::MxView& A, const mxfp8::MxView& B, const Tensor& all_rows, const Tensor& C) {
    mx_grouped_gemm(A, B, all_rows, C);
  }
  virtual void mx_gemm_wgrad(const mxfp8::MxView& A, const mxfp8::MxView& B, const Tensor& all_k, const Tensor& C) {
    mx_grouped_gemm_wgrad(A, B, all_k, C);
  }

  // ---- SwiGLU x routing weight --------------------------------------------------------------------
  // h13 [R,2f] = [gate | up]; a[r,i] = silu(gate[r,i]) * up[r,i] * wp[r]   a [R,f] (overwrite)
  virtual void swiglu_forward(const Tensor& h13, const Tensor& wp, const Tensor& a) = 0;
  // dh13 [R,2f] (overwrite), dwp [R] F32 (overwrite)
  virtual void swiglu_backward(const Tensor& da, const Tensor& h13, const Tensor& wp, const Tensor& dh13,
                               const Tensor& dwp) = 0;
  // The experts' first half in one call: h13 = grouped_gemm(x, W13) then a = swiglu_forward(h13, wp), the same
  // values (a device backend keeps h13 in registers for the SwiGLU instead of reading it back).
  virtual void grouped_gemm_swiglu(const Tensor& x, const Tensor& W13, const Tensor& offsets, const Tensor& wp,
                                   const Tensor& h13, const Tensor& a) {
    grouped_gemm(x, W13, offsets, h13);
    swiglu_forward(h13, wp, a);
  }
  // And their backward's middle: dact = grouped_gemm_dgrad(dy, W2) into the scratch dact [R, f], then
  // swiglu_backward(dact, h13, wp, dh13, dwp): the same dh13 and dwp up to the order of dwp's sums (a device
  // backend keeps dact in registers and may use dact's memory for partial sums, leaving it undefined).
  virtual void grouped_gemm_dgrad_swiglu(const Tensor& dy, const Tensor& W2, const Tensor& offsets, const Tensor& h13,
                                         const Tensor& wp, const Tensor& dact, const Tensor& dh13, const Tensor& dwp) {
    grouped_gemm_dgrad(dy, W2, offsets, dact);
    swiglu_backward(dact, h13, wp, dh13, dwp);
  }

  // ---- LM head + cross-entropy (never needs the full logits of the batch at once) -----------------------
  // logits = h @ W^T; loss_t = logsumexp(logits_t) - logits_t[labels[t]] for labels[t] >= 0 (-100: ignored).
  // loss_sum[0] += sum_t loss_t (F32 [1]). If dh is non-empty: dh [T,d] (overwrite) and dW [V,d]
  // (accumulate) get the gradient of grad_scale * sum_t loss_t. With dlogits [T,V] (act dtype) given as well, the
  // logits' gradient is left there instead and dW is not touched (may be empty): the caller contracts
  // dW += dlogits^T h itself, e.g. over several micro-batches at once (lm_head_wgrad_micro_batches).
  virtual void lm_head_loss(const Tensor& h, const Tensor& W, const Tensor& labels, float grad_scale,
                            const Tensor& loss_sum, const Tensor& dh, const Tensor& dW,
                            const Tensor& dlogits = Tensor()) = 0;

  // ---- optimizer ----------------------------------------------------------------------------------
  // torch.optim.AdamW semantics (decoupled weight decay), on F32 param/grad/m/v of equal numel.
  virtual void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                          const AdamWStep& s) = 0;
  // The same step, then working[i] = the updated param[i] in working's dtype for i < working.numel() (<= param's;
  // an empty working: the plain step): the optimizer writes the model's working copy in the same pass, instead of
  // a second read of the master.
  virtual void adamw_step_to(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                             const AdamWStep& s, const Tensor& working) {
    adamw_step(param, grad, m, v, s);
    if (working.numel() > 0) copy(param.rows(0, working.numel()), working);
  }
  // The same step on a master held split (optimizer_store_param_remainders): hi [n] BF16 and rem [n] I16 join
  // into the fp32 param (join_master), which is updated and split back into both. Backends without it refuse.
  virtual void adamw_step_split(const Tensor& hi, const Tensor& rem, const Tensor& grad, const Tensor& m,
                                const Tensor& v, const AdamWStep& s) {
    (void)hi, (void)rem, (void)grad, (void)m, (void)v, (void)s;
    throw std::invalid_argument("adamw_step_split: this backend keeps the fp32 master whole "
                                "(optimizer_store_param_remainders needs the CUDA bf16 backend)");
  }
};

std::unique_ptr<Ops> make_cpu_ops();

// Elements [from, from + n) of an F32 or BF16 buffer to or from host F32 (BF16 widened exactly, or narrowed to
// nearest even): checkpoints and expert moves handle the AdamW moments in F32 whatever adamw_moments_dtype holds.
void download_f32(Ops& ops, const Tensor& t, int64_t from, int64_t n, float* dst);
void upload_f32(Ops& ops, const Tensor& t, int64_t from, int64_t n, const float* src);

}  // namespace mxt
