#include "model/mx_linear.hpp"

namespace mxt {

using mxfp8::Direction;

MxRows mx_dense_rowwise(Ops& ops, const MxDense& m, const Tensor& x, const MxBuf& buf) {
  const int64_t in = x.numel() / m.T;
  if (m.bf16 && mx_row_values()) return mx_rows_values(ops, x.view({m.T, in}), m.T, in, m.fwd, m.deq_a, nullptr);
  MxRows a;
  a.q = buf.view(1, m.T, in, m.fwd, Direction::Rowwise);
  ops.mx_quantize(x.view({m.T, in}), &a.q, nullptr);
  return a;
}

mxfp8::MxView mx_dense_colwise(Ops& ops, const MxDense& m, const Tensor& x, const MxBuf& buf) {
  const mxfp8::MxView v = buf.view(1, m.T, x.numel() / m.T, m.fwd, Direction::Columnwise);
  ops.mx_quantize(x.view({m.T, x.numel() / m.T}), nullptr, &v);
  return v;
}

MxRows mx_dense_quantize(Ops& ops, const MxDense& m, const Tensor& x, const MxBuf& row, const MxBuf& col) {
  const int64_t in = x.numel() / m.T;
  const mxfp8::MxView c = col.view(1, m.T, in, m.fwd, Direction::Columnwise);
  if (m.bf16 && mx_row_values()) return mx_rows_values(ops, x.view({m.T, in}), m.T, in, m.fwd, m.deq_a, &c);
  MxRows a;
  a.q = row.view(1, m.T, in, m.fwd, Direction::Rowwise);
  ops.mx_quantize(x.view({m.T, in}), &a.q, &c);
  return a;
}

void mx_linear_forward(Ops& ops, const MxDense& m, const MxRows& x_row, const MxWeight& W, const Tensor& y) {
  if (m.bf16) {
    ops.gemm(false, true, m.T, W.rows, W.cols, 1.f, mx_values(ops, x_row, m.deq_a), W.deq_row, 0.f,
             y.view({m.T, W.rows}));
    return;
  }
  ops.mx_grouped_gemm(x_row.q, W.rowwise(), m.offsets, y.view({m.T, W.rows}));
}

void mx_linear_backward(Ops& ops, const MxDense& m, const Tensor& dy, const MxWeight& W,
                        const mxfp8::MxView& x_col, const Tensor& dx, const Tensor& tmp, const Tensor& dW) {
  const int64_t out = W.rows, in = W.cols;
  const mxfp8::MxView gr = m.a.view(1, m.T, out, m.grad, Direction::Rowwise);
  const mxfp8::MxView gc = m.b.view(1, m.T, out, m.grad, Direction::Columnwise);
  const bool acc = tmp.data != nullptr;
  if (m.bf16) {  // dx (+)= dy W, dW += dy^T x on the values (cuBLASLt accumulates into dx: no tmp)
    MxRows g;
    if (mx_row_values()) {
      g = mx_rows_values(ops, dy.view({m.T, out}), m.T, out, m.grad, m.deq_a, &gc);
    } else {
      g.q = gr;
      ops.mx_quantize(dy.view({m.T, out}), &gr, &gc);
    }
    ops.gemm(false, false, m.T, in, out, 1.f, mx_values(ops, g, m.deq_a), W.deq_col, acc ? 1.f : 0.f,
             dx.view({m.T, in}));
    ops.gemm(true, false, out, in, m.T, 1.f, mx_dequantized(ops, gc, m.deq_a), mx_dequantized(ops, x_col, m.deq_b), 1.f,
             dW.view({out, in}));
    return;
  }
  ops.mx_quantize(dy.view({m.T, out}), &gr, &gc);
  ops.mx_grouped_gemm(gr, W.colwise(), m.offsets, (acc ? tmp : dx).view({m.T, in}));
  if (acc) ops.add(dx, tmp, dx);
  ops.mx_grouped_gemm_wgrad(gc, x_col, m.offsets, dW.view({1, out, in}));
}

}  // namespace mxt
