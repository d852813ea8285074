#include "model/mx_linear.hpp"

namespace mxt {

using mxfp8::Direction;

namespace {

// x [T, cols] in one pass: the GEMM's A (codes in row, or with hopper_gemm=bf16 and mx_row_values() its values
// in m.deq_a) and, if given, the columnwise copy.
MxRows dense_rows(Ops& ops, const MxDense& m, const Tensor& x, mxfp8::Format f, const MxBuf& row,
                  const mxfp8::MxView* col) {
  const int64_t cols = x.numel() / m.T;
  return mx_quantize_rows(ops, x.view({m.T, cols}), m.T, cols, f, row, m.bf16 && mx_row_values() ? &m.deq_a : nullptr,
                          col);
}

}  // namespace

MxRows mx_dense_rowwise(Ops& ops, const MxDense& m, const Tensor& x, const MxBuf& buf) {
  return dense_rows(ops, m, x, m.fwd, buf, nullptr);
}

mxfp8::MxView mx_dense_colwise(Ops& ops, const MxDense& m, const Tensor& x, const MxBuf& buf) {
  const mxfp8::MxView v = buf.view(1, m.T, x.numel() / m.T, m.fwd, Direction::Columnwise);
  ops.mx_quantize(x.view({m.T, x.numel() / m.T}), nullptr, &v);
  return v;
}

MxRows mx_dense_quantize(Ops& ops, const MxDense& m, const Tensor& x, const MxBuf& row, const MxBuf& col) {
  const mxfp8::MxView c = col.view(1, m.T, x.numel() / m.T, m.fwd, Direction::Columnwise);
  return dense_rows(ops, m, x, m.fwd, row, &c);
}

void mx_linear_forward(Ops& ops, const MxDense& m, const MxRows& x_row, const MxWeight& W, const Tensor& y) {
  if (m.bf16) {
    ops.gemm(false, true, m.T, W.rows, W.cols, 1.f, mx_values(ops, x_row, m.deq_a), W.deq_row, 0.f,
             y.view({m.T, W.rows}));
    return;
  }
  ops.mx_gemm(x_row.q, W.rowwise(), m.offsets, y.view({m.T, W.rows}));
}

void mx_linear_backward(Ops& ops, const MxDense& m, const Tensor& dy, const MxWeight& W,
                        const mxfp8::MxView& x_col, const Tensor& dx, const Tensor& tmp, const Tensor& dW) {
  const int64_t out = W.rows, in = W.cols;
  const mxfp8::MxView gc = m.b.view(1, m.T, out, m.grad, Direction::Columnwise);
  const MxRows g = dense_rows(ops, m, dy, m.grad, m.a, &gc);
  const bool acc = tmp.data != nullptr;
  if (m.bf16) {  // dx (+)= dy W, dW += dy^T x on the values (cuBLASLt accumulates into dx: no tmp)
    ops.gemm(false, false, m.T, in, out, 1.f, mx_values(ops, g, m.deq_a), W.deq_col, acc ? 1.f : 0.f,
             dx.view({m.T, in}));
    ops.gemm(true, false, out, in, m.T, 1.f, mx_dequantized(ops, gc, m.deq_a), mx_dequantized(ops, x_col, m.deq_b), 1.f,
             dW.view({out, in}));
    return;
  }
  ops.mx_gemm(g.q, W.colwise(), m.offsets, (acc ? tmp : dx).view({m.T, in}));
  if (acc) ops.add(dx, tmp, dx);
  ops.mx_gemm_wgrad(gc, x_col, m.offsets, dW.view({1, out, in}));
}

}  // namespace mxt
