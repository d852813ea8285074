#pragma once
// The expert MLP (grouped GEMM w13 -> SwiGLU x routing weight -> grouped GEMM w2) in MXFP8, forward and
// backward, with Transformer Engine's operand directions (shared/docs/mxfp8.md):
//   forward  X rowwise  x W rowwise      dgrad  dY rowwise x W columnwise      wgrad  dY columnwise x X columnwise
// Used by MixtralModel (fp8_config.enabled) and by the tests, which compare it with the bf16 / fp32 ops.
#include <cstdint>
#include <functional>

#include "mxtrain/mx_buffers.hpp"
#include "mxtrain/ops.hpp"

namespace mxt {

// Rows are padded to 32 only for the columnwise (token-blocked) copies: the pad rows are zero, so they leave
// every block scale and every wgrad sum unchanged.
inline int64_t mx_pad_rows(int64_t n) { return (n + 31) / 32 * 32; }

// One layer's expert run on n rows (offsets[E] == n).
struct MxExpertRun {
  int64_t n = 0, d = 0, f = 0;
  mxfp8::Format fwd = mxfp8::Format::E4M3;   // activations and weights
  mxfp8::Format grad = mxfp8::Format::E4M3;  // output gradients (E5M2 with fp8_format=HYBRID)
  Tensor offsets;                            // [E+1] I32, on the ops' device
  MxBuf x_col, act_col;  // kept from the forward for the wgrads: room for mx_pad_rows(n) x d and x f
  MxBuf row, col;        // scratch: room for mx_pad_rows(n) x max(d, 2f) each
  MxBuf x_row;           // recompute_experts: the input's rowwise copy, kept for mx_experts_recompute (else empty)
  // fp8_config.hopper_gemm=bf16: the GEMMs run as bf16 grouped GEMMs on dequantised operands (the weights' deq
  // copies; activations dequantised into deq_a, deq_b: act dtype, room for mx_pad_rows(n) x max(d, 2f) and x
  // max(d, f) elements).
  bool bf16 = false;
  Tensor deq_a, deq_b;
  // bf16 with expert_wgrad_micro_batches > 1: does the weight gradients dW += dY^T X instead (from the columnwise
  // copies; the model's held micro-batches: MixtralModel::mx_held_wgrad).
  std::function<void(const mxfp8::MxView& dyc, const mxfp8::MxView& xc, const Tensor& dW)> wgrad;
};

// x [>= n_pad, d] (its rows [n, n_pad) are zeroed here), wp [n] F32 ->
// h13 [>= n, 2f] (kept for the backward), act [>= n_pad, f] (scratch), y [>= n, d]; fills x_col, act_col.
void mx_experts_forward(Ops& ops, const MxExpertRun& r, const MxExpertWeights& w, const Tensor& x,
                        const Tensor& wp, const Tensor& h13, const Tensor& act, const Tensor& y);
// recompute_experts, at the start of the backward: h13 and act (scratch) and act_col exactly as the forward made
// them, from the kept x_row.
void mx_experts_recompute(Ops& ops, const MxExpertRun& r, const MxExpertWeights& w, const Tensor& wp,
                          const Tensor& h13, const Tensor& act);
// dy [>= n_pad, d] (rows [n, n_pad) zeroed here) -> dact [>= n, f], dh13 [>= n_pad, 2f] (scratch),
// dx [>= n, d] (overwrite), dwp [n] F32 (overwrite); dw13 [E, 2f, d], dw2 [E, d, f] F32 (accumulate).
void mx_experts_backward(Ops& ops, const MxExpertRun& r, const MxExpertWeights& w, const Tensor& dy,
                         const Tensor& h13, const Tensor& wp, const Tensor& dact, const Tensor& dh13,
                         const Tensor& dx, const Tensor& dwp, const Tensor& dw13, const Tensor& dw2,
                         const std::function<void()>& after_dgrad = {});  // called once dx is written

// The E4M3 copies of a weight [rows, cols] or [E, rows, cols] in one pass: both, or only one of them.
void mx_quantize_weight(Ops& ops, const Tensor& W, const MxWeight& q, bool rowwise = true, bool colwise = true);

}  // namespace mxt
