// CudaOps' MXFP8 ops: thin forwards to the MXFP8 kernels behind kernels/mxfp8_cuda.hpp (quantiser and grouped
// GEMMs), so the model reaches them through the op interface like every other op.
#include "cuda_ops.hpp"
#include "mxfp8_cuda.hpp"

namespace mxt {

void CudaOps::mx_quantize(const Tensor& x, const mxfp8::MxView* rowwise, const mxfp8::MxView* colwise) {
  mxfp8::quantize_cuda(*this, x, rowwise, colwise);
}

void CudaOps::mx_dequantize(const mxfp8::MxView& q, const Tensor& out) { mxfp8::dequantize_cuda(*this, q, out); }
void CudaOps::mx_quantize_values(const Tensor& x, mxfp8::Format row_format, const Tensor& row_values,
                                 const mxfp8::MxView* colwise) {
  mxfp8::quantize_values_cuda(*this, x, row_format, row_values, colwise);
}

void CudaOps::mx_grouped_gemm(const mxfp8::MxView& A, const mxfp8::MxView& B, const Tensor& offsets,
                              const Tensor& C) {
  mxfp8::grouped_gemm_cuda(*this, A, B, offsets, C);
}

void CudaOps::mx_grouped_gemm_wgrad(const mxfp8::MxView& A, const mxfp8::MxView& B, const Tensor& offsets,
                                    const Tensor& C) {
  mxfp8::grouped_gemm_wgrad_cuda(*this, A, B, offsets, C);
}

void CudaOps::mx_gemm(const mxfp8::MxView& A, const mxfp8::MxView& B, const Tensor& all_rows, const Tensor& C) {
  mxfp8::dense_gemm_cuda(*this, A, B, all_rows, C);
}

void CudaOps::mx_gemm_wgrad(const mxfp8::MxView& A, const mxfp8::MxView& B, const Tensor& all_k, const Tensor& C) {
  mxfp8::dense_gemm_wgrad_cuda(*this, A, B, all_k, C);
}

}  // namespace mxt
