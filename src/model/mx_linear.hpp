#pragma once
// Dense y = x W^T ([out, in] weights) and its backward in MXFP8: Ops::mx_gemm / mx_gemm_wgrad (offsets {0, T}),
// with the recipe's operand directions (forward x rowwise x W rowwise; dgrad dy rowwise x W columnwise;
// wgrad dy columnwise x x columnwise). T must be a multiple of 32 (the wgrad blocks run along tokens).
#include <cstdint>

#include "mxtrain/mx_buffers.hpp"
#include "mxtrain/ops.hpp"

namespace mxt {

struct MxDense {
  Tensor offsets;  // {0, T} I32 on the ops' device
  int64_t T = 0;
  mxfp8::Format fwd = mxfp8::Format::E4M3, grad = mxfp8::Format::E4M3;
  MxBuf a, b;  // scratch: dy rowwise / x rowwise, dy columnwise; room for T x max(in, out) each
  bool bf16 = false;   // fp8_config.hopper_gemm=bf16: cuBLASLt GEMMs on dequantised operands (the weights' deq
  Tensor deq_a, deq_b;  // copies; activations into these, act dtype, room for T x max(in, out) each)
};

// x [T, in] -> its rowwise copy in buf (the forward's A, shared by every linear reading x); with m.bf16 its
// values in m.deq_a instead.
MxRows mx_dense_rowwise(Ops& ops, const MxDense& m, const Tensor& x, const MxBuf& buf);
// x [T, in] -> its columnwise copy in buf (the wgrad's B).
mxfp8::MxView mx_dense_colwise(Ops& ops, const MxDense& m, const Tensor& x, const MxBuf& buf);
// Both in one pass over x: the rowwise copy in row (returned; with m.bf16 its values in m.deq_a), the columnwise
// one in col (the same bits as mx_dense_colwise's: read back with col.view(1, T, in, m.fwd, Columnwise)).
MxRows mx_dense_quantize(Ops& ops, const MxDense& m, const Tensor& x, const MxBuf& row, const MxBuf& col);
// y [T, out] (overwrite) = x W^T from x's rowwise copy.
void mx_linear_forward(Ops& ops, const MxDense& m, const MxRows& x_row, const MxWeight& W, const Tensor& y);
// dx [T, in] = dy W (overwrite; with `tmp` given: dx += dy W, through tmp [T, in]); dW [out, in] F32 += dy^T x
// from x's columnwise copy. Uses m.a and m.b.
void mx_linear_backward(Ops& ops, const MxDense& m, const Tensor& dy, const MxWeight& W,
                        const mxfp8::MxView& x_col, const Tensor& dx, const Tensor& tmp, const Tensor& dW);

}  // namespace mxt
