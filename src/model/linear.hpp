#pragma once
// y = x W^T with HF's [out, in] weights, and its two backward GEMMs.
#include "mxtrain/ops.hpp"

namespace mxt {

inline void linear_forward(Ops& ops, const Tensor& x, const Tensor& W, const Tensor& y) {
  ops.gemm(false, true, x.dim(0), W.dim(0), W.dim(1), 1.f, x, W, 0.f, y);
}
// dx = dy W; accumulate adds into dx instead of overwriting it.
inline void linear_dgrad(Ops& ops, const Tensor& dy, const Tensor& W, const Tensor& dx, bool accumulate) {
  ops.gemm(false, false, dy.dim(0), W.dim(1), W.dim(0), 1.f, dy, W, accumulate ? 1.f : 0.f, dx);
}
// dW += dy^T x
inline void linear_wgrad(Ops& ops, const Tensor& dy, const Tensor& x, const Tensor& dW) {
  ops.gemm(true, false, dW.dim(0), dW.dim(1), dy.dim(0), 1.f, dy, x, 1.f, dW);
}

}  // namespace mxt
