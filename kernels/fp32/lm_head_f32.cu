// The fp32 backend's LM head + cross-entropy, chunked over tokens as CudaOps's (lm_head_chunk_tokens): fp32
// logits from cuBLASLt (CUBLAS_COMPUTE_32F), per row the log-sum-exp in fp64 as the CPU twin, and the logits
// turned in place into their gradient grad_scale * (softmax - onehot) before the two gradient GEMMs. Labels:
// -100 ignored; outside [0, V) the row's loss is NaN (no host sync can report it) and its gradient zero.
#include <cmath>
#include <cfloat>
#include <string>

#include "cuda_context.cuh"
#include "fp32/cuda_f32_ops.hpp"
#include "fp32/f32_common.cuh"

namespace mxt {

namespace {

using cuda::block_max;
using cuda::block_sum_f64;
using cuda::f32k::kRowThreads;

constexpr int32_t kIgnore = -100;

__global__ void ce_kernel(float* __restrict__ z, const int32_t* __restrict__ labels, int64_t V, float grad_scale,
                          bool grad, double* __restrict__ row_loss) {
  const int64_t r = blockIdx.x;
  float* zr = z + r * V;
  const int32_t y = labels[r];
  if (y == kIgnore || y < 0 || y >= V) {
    if (threadIdx.x == 0) row_loss[r] = y == kIgnore ? 0.0 : static_cast<double>(NAN);
    if (grad)
      for (int64_t v = threadIdx.x; v < V; v += blockDim.x) zr[v] = 0.f;
    return;
  }
  float m = -FLT_MAX;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) m = fmaxf(m, zr[v]);
  m = block_max(m);
  double sum = 0.0;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) sum += exp(static_cast<double>(zr[v]) - m);
  sum = block_sum_f64(sum);
  const double lse = m + log(sum);
  const float zy = zr[y];
  __syncthreads();  // every thread has read zr[y] before it is overwritten
  if (threadIdx.x == 0) row_loss[r] = lse - zy;
  if (!grad) return;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x)
    zr[v] = static_cast<float>(grad_scale * exp(static_cast<double>(zr[v]) - lse)) - (v == y ? grad_scale : 0.f);
}

// loss_sum[0] = float(loss_sum[0] + the rows' losses summed in order): the CPU twin's rounding.
__global__ void loss_sum_kernel(const double* __restrict__ row_loss, int64_t T, float* __restrict__ loss_sum) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  double total = 0.0;
  for (int64_t t = 0; t < T; ++t) total += row_loss[t];
  loss_sum[0] = static_cast<float>(loss_sum[0] + total);
}

}  // namespace

void CudaF32Ops::lm_head_loss(const Tensor& h, const Tensor& W, const Tensor& labels, float grad_scale,
                              const Tensor& loss_sum, const Tensor& dh, const Tensor& dW, const Tensor& dlogits) {
  const char* op = "lm_head_loss";
  const auto [T, V, d, grad, keep] = check_lm_head(op, h, W, labels, loss_sum, dh, dW, dlogits);
  float* hp = cuda::f32(h, op, "h");
  (void)cuda::f32(W, op, "W");
  const int32_t* lab = cuda::i32(labels, op, "labels");
  float* ls = cuda::f32(loss_sum, op, "loss_sum");
  float* dhp = grad ? cuda::f32(dh, op, "dh") : nullptr;
  if (grad && !keep) (void)cuda::f32(dW, op, "dW");
  float* kept = keep ? cuda::f32(dlogits, op, "dlogits") : nullptr;
  if (T == 0) return;

  const int64_t chunk = keep ? T : lm_head_chunk_rows(T, lm_head_chunk_);
  float* logits = keep ? kept : static_cast<float*>(ctx_->scratch("f32_lm_head.logits", sizeof(float) * chunk * V));
  auto* row_loss = static_cast<double*>(ctx_->scratch("f32_lm_head.row_loss", sizeof(double) * T));
  for (int64_t t0 = 0; t0 < T; t0 += chunk) {
    const int64_t n = chunk < T - t0 ? chunk : T - t0;
    const Tensor hc(hp + t0 * d, DType::F32, {n, d}, Device::CUDA);
    const Tensor Z(logits, DType::F32, {n, V}, Device::CUDA);
    gemm(false, true, n, V, d, 1.f, hc, W, 0.f, Z);
    ce_kernel<<<static_cast<unsigned>(n), kRowThreads, 0, ctx_->stream>>>(logits, lab + t0, V, grad_scale, grad,
                                                                         row_loss + t0);
    cuda::check_launch(op);
    if (!grad) continue;
    const Tensor dhc(dhp + t0 * d, DType::F32, {n, d}, Device::CUDA);
    gemm(false, false, n, d, V, 1.f, Z, W, 0.f, dhc);
    if (!keep) gemm(true, false, V, d, n, 1.f, Z, hc, 1.f, dW);
  }
  loss_sum_kernel<<<1, 32, 0, ctx_->stream>>>(row_loss, T, ls);
  cuda::check_launch(op);
}

}  // namespace mxt
