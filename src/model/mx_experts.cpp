#include "model/mx_experts.hpp"

namespace mxt {

namespace {

using mxfp8::Direction;

// Quantises rows [0, n_pad) of x (zeroing its pad rows first) both ways: the columnwise copy into col (xc), and
// the rowwise one, cut to the first n rows (a prefix of the rowwise layout), as the GEMM's A: its codes in row,
// or with hopper_gemm=bf16 its values straight into r.deq_a (unless its codes are wanted: keep_codes).
MxRows quantize_both(Ops& ops, const MxExpertRun& r, const Tensor& x, int64_t n, int64_t cols, mxfp8::Format f,
                     const MxBuf& row, const MxBuf& col, mxfp8::MxView& xc, bool keep_codes = false) {
  const int64_t np = mx_pad_rows(n);
  if (np > n) ops.zero(x.rows(n, np - n));
  xc = col.view(1, np, cols, f, Direction::Columnwise);
  const bool values = r.bf16 && !keep_codes && mx_row_values();
  return mx_quantize_rows(ops, x, np, cols, f, row, values ? &r.deq_a : nullptr, &xc).first(n);
}

// C = A B[e]^T grouped along rows (forward, dgrad): the MXFP8 kernel on the codes, or (bf16) the bf16 grouped GEMM
// on A's values and the weight's deq copy (the rowwise one in the forward's layout, the columnwise one read by the
// bf16 dgrad).
void grouped_rows(Ops& ops, const MxExpertRun& r, const MxRows& A, const MxWeight& W, bool forward,
                  const Tensor& C) {
  if (!r.bf16) {
    ops.mx_grouped_gemm(A.q, forward ? W.rowwise() : W.colwise(), r.offsets, C);
    return;
  }
  const Tensor a = mx_values(ops, A, r.deq_a);
  if (forward) ops.grouped_gemm(a, W.deq_row, r.offsets, C);
  else ops.grouped_gemm_dgrad(a, W.deq_col, r.offsets, C);
}

// dW += dY^T X over each expert's rows, from the two columnwise copies.
void grouped_wgrad(Ops& ops, const MxExpertRun& r, const mxfp8::MxView& dyc, const mxfp8::MxView& xc,
                   const Tensor& dW) {
  if (!r.bf16) {
    ops.mx_grouped_gemm_wgrad(dyc, xc, r.offsets, dW);
    return;
  }
  if (r.wgrad) {
    r.wgrad(dyc, xc, dW);
    return;
  }
  ops.grouped_gemm_wgrad(mx_dequantized(ops, dyc, r.deq_a), mx_dequantized(ops, xc, r.deq_b), r.offsets, dW);
}

// h13 = x W13 from x's rowwise copy, act = SwiGLU(h13) x wp, and act's copies (ac kept for the wgrad): the
// forward's first half, which mx_experts_recompute repeats bit for bit. Returns act's rowwise copy (A of w2).
MxRows up_projection(Ops& ops, const MxExpertRun& r, const MxExpertWeights& w, const MxRows& xr, const Tensor& wp,
                     const Tensor& h13, const Tensor& act, mxfp8::MxView& ac) {
  if (r.bf16) {  // (the SwiGLU in the GEMM's epilogue where the backend fuses it)
    ops.grouped_gemm_swiglu(mx_values(ops, xr, r.deq_a), w.w13.deq_row, r.offsets, wp, h13.rows(0, r.n),
                            act.rows(0, r.n));
  } else {
    grouped_rows(ops, r, xr, w.w13, true, h13.rows(0, r.n));
    ops.swiglu_forward(h13.rows(0, r.n), wp, act.rows(0, r.n));
  }
  return quantize_both(ops, r, act, r.n, r.f, r.fwd, r.row, r.act_col, ac);
}

}  // namespace

void mx_experts_forward(Ops& ops, const MxExpertRun& r, const MxExpertWeights& w, const Tensor& x,
                        const Tensor& wp, const Tensor& h13, const Tensor& act, const Tensor& y) {
  const int64_t n = r.n;
  if (n == 0) return;
  mxfp8::MxView xc, ac;
  // recompute_experts keeps x's rowwise codes in x_row for mx_experts_recompute
  const bool keep = r.x_row.data.numel() > 0;
  const MxRows xr = quantize_both(ops, r, x, n, r.d, r.fwd, keep ? r.x_row : r.row, r.x_col, xc, keep);
  const MxRows ar = up_projection(ops, r, w, xr, wp, h13, act, ac);
  grouped_rows(ops, r, ar, w.w2, true, y.rows(0, n));
}

void mx_experts_recompute(Ops& ops, const MxExpertRun& r, const MxExpertWeights& w, const Tensor& wp,
                          const Tensor& h13, const Tensor& act) {
  const int64_t n = r.n;
  if (n == 0) return;
  MxRows xr;
  xr.q = r.x_row.view(1, mx_pad_rows(n), r.d, r.fwd, Direction::Rowwise);
  xr.q.rows = n;
  mxfp8::MxView ac;
  up_projection(ops, r, w, xr, wp, h13, act, ac);
}

void mx_experts_backward(Ops& ops, const MxExpertRun& r, const MxExpertWeights& w, const Tensor& dy,
                         const Tensor& h13, const Tensor& wp, const Tensor& dact, const Tensor& dh13,
                         const Tensor& dx, const Tensor& dwp, const Tensor& dw13, const Tensor& dw2,
                         const std::function<void()>& after_dgrad) {
  const int64_t n = r.n, np = mx_pad_rows(n);
  if (n == 0) return;
  // The forward's columnwise copies, as it wrote them.
  const mxfp8::MxView xc = r.x_col.view(1, np, r.d, r.fwd, Direction::Columnwise);
  const mxfp8::MxView ac = r.act_col.view(1, np, r.f, r.fwd, Direction::Columnwise);
  mxfp8::MxView gc;
  // w2: dact = dy w2 (dgrad), dw2 += dy^T act (wgrad)
  const MxRows gr = quantize_both(ops, r, dy, n, r.d, r.grad, r.row, r.col, gc);
  if (r.bf16) {  // (the SwiGLU backward in the dgrad's epilogue where the backend fuses it)
    ops.grouped_gemm_dgrad_swiglu(mx_values(ops, gr, r.deq_a), w.w2.deq_col, r.offsets, h13.rows(0, n), wp,
                                  dact.rows(0, n), dh13.rows(0, n), dwp);
  } else {
    grouped_rows(ops, r, gr, w.w2, false, dact.rows(0, n));
    ops.swiglu_backward(dact.rows(0, n), h13.rows(0, n), wp, dh13.rows(0, n), dwp);
  }
  grouped_wgrad(ops, r, gc, ac, dw2);
  // w13: dx = dh13 w13, dw13 += dh13^T x
  const MxRows hr = quantize_both(ops, r, dh13, n, 2 * r.f, r.grad, r.row, r.col, gc);
  grouped_rows(ops, r, hr, w.w13, false, dx.rows(0, n));
  if (after_dgrad) after_dgrad();
  grouped_wgrad(ops, r, gc, xc, dw13);
}

void mx_quantize_weight(Ops& ops, const Tensor& W, const MxWeight& q, bool rowwise, bool colwise) {
  mxfp8::MxView row, col;
  if (rowwise) row = q.rowwise();
  if (colwise) col = q.colwise();
  ops.mx_quantize(W, rowwise ? &row : nullptr, colwise ? &col : nullptr);
  if (rowwise && q.deq_row.data) ops.mx_dequantize(row, q.deq_row);
  if (colwise && q.deq_col.data) ops.mx_dequantize(col, q.deq_col);
}

}  // namespace mxt
