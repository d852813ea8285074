// Elementwise CudaOps: zero, copy (F32 <-> BF16 conversion), add, mul, scale and the deterministic
// sum of squares used for gradient norms. All math in fp32 (sum_squares in fp64); bf16 stores round to
// nearest even. Every kernel is a grid-stride loop with 64-bit indices.
#include <string>
#include <type_traits>

#include "cuda_common.cuh"
#include "cuda_context.cuh"
#include "cuda_ops.hpp"

namespace mxt {

namespace {

using cuda::bf16;

constexpr int kThreads = 256;

// A float tensor of either dtype: exactly one of the two pointers is set (both null when it is empty).
struct FloatPtr {
  float* f = nullptr;
  bf16* b = nullptr;
};

FloatPtr float_ptr(const Tensor& t, const char* op, const char* arg) {
  FloatPtr p;
  if (t.dtype == DType::F32) {
    p.f = cuda::f32(t, op, arg);
  } else if (t.dtype == DType::BF16) {
    p.b = cuda::bf16p(t, op, arg);
  } else {
    cuda::fail(op, std::string(arg) + " must be f32 or bf16, got " + dtype_name(t.dtype) + " " + t.shape_str());
  }
  return p;
}

void expect_cuda(const Tensor& t, const char* op, const char* arg) {
  if (t.numel() > 0 && t.device != Device::CUDA) cuda::fail(op, std::string(arg) + " is not a CUDA tensor");
  if (t.numel() > 0 && t.data == nullptr) cuda::fail(op, std::string(arg) + " has no data");
}

// ---- kernels -------------------------------------------------------------------------------------

template <typename S, typename D>
__global__ void convert_kernel(const S* __restrict__ src, D* __restrict__ dst, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    cuda::st(dst, i, cuda::ld(src, i));
}

// out may alias a or b (same element index read before it is written, by the same thread), so no __restrict__.
template <bool kMul, typename A, typename B, typename O>
__global__ void binary_kernel(const A* a, const B* b, O* out, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float x = cuda::ld(a, i), y = cuda::ld(b, i);
    cuda::st(out, i, kMul ? __fmul_rn(x, y) : __fadd_rn(x, y));
  }
}

// All three bf16, 8 elements per thread and step through 16-byte accesses (n % 8 == 0, aligned: the residual
// adds); binary_kernel's arithmetic. out may alias a or b, as there.
template <bool kMul>
__global__ void binary_bf16x8_kernel(const bf16* a, const bf16* b, bf16* out, int64_t n8) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n8; i += stride) {
    float x[8], y[8];
    cuda::load8(a + 8 * i, x);
    cuda::load8(b + 8 * i, y);
#pragma unroll
    for (int k = 0; k < 8; ++k) x[k] = kMul ? __fmul_rn(x[k], y[k]) : __fadd_rn(x[k], y[k]);
    cuda::store8(out + 8 * i, x);
  }
}

template <typename T>
__global__ void scale_kernel(T* t, float s, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    cuda::st(t, i, __fmul_rn(cuda::ld(t, i), s));
}

// Pass 1: block b sums the squares (kSquare; else the values) of elements b*blockDim + tid + k*gridDim*blockDim in
// fp64 and writes its partial. The grid size depends only on n, so the summation order (and the result) is
// reproducible.
template <typename T, bool kSquare = true>
__global__ void sum_squares_partial_kernel(const T* __restrict__ x, int64_t n, double* __restrict__ partials) {
  double s = 0.0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const double v = cuda::ld(x, i);
    s += kSquare ? v * v : v;
  }
  s = cuda::block_sum_f64(s);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

// Pass 2 (one block): acc[0] = float(acc[0] + sum of the partials), the partials summed in a fixed order.
__global__ void sum_squares_final_kernel(const double* __restrict__ partials, int nparts, float* acc) {
  double s = 0.0;
  for (int i = threadIdx.x; i < nparts; i += blockDim.x) s += partials[i];
  s = cuda::block_sum_f64(s);
  if (threadIdx.x == 0) acc[0] = static_cast<float>(static_cast<double>(acc[0]) + s);
}

constexpr int kSumSqMaxBlocks = 1024;

// fp32 -> bf16, 8 elements per thread and step (two 16-byte loads, one 16-byte store): the working-weight
// refresh after every optimizer step.
__global__ void f32_to_bf16_vec_kernel(const float* __restrict__ src, cuda::bf16* __restrict__ dst, int64_t n8) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n8; i += stride) {
    const float4 a = reinterpret_cast<const float4*>(src)[2 * i], b = reinterpret_cast<const float4*>(src)[2 * i + 1];
    const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    cuda::store8(dst + 8 * i, v);
  }
}

template <typename S, typename D>
void launch_convert(const S* s, D* d, int64_t n, cudaStream_t st) {
  if constexpr (std::is_same_v<S, float> && std::is_same_v<D, cuda::bf16>) {
    if (n % 8 == 0 && cuda::aligned16(s) && cuda::aligned16(d)) {
      f32_to_bf16_vec_kernel<<<cuda::blocks_for(n / 8, kThreads), kThreads, 0, st>>>(s, d, n / 8);
      cuda::check_launch("copy");
      return;
    }
  }
  convert_kernel<S, D><<<cuda::blocks_for(n, kThreads), kThreads, 0, st>>>(s, d, n);
  cuda::check_launch("copy");
}

template <bool kMul, typename A, typename B>
void launch_binary_o(const A* a, const B* b, const FloatPtr& o, int64_t n, cudaStream_t st, const char* op) {
  if (o.f)
    binary_kernel<kMul><<<cuda::blocks_for(n, kThreads), kThreads, 0, st>>>(a, b, o.f, n);
  else
    binary_kernel<kMul><<<cuda::blocks_for(n, kThreads), kThreads, 0, st>>>(a, b, o.b, n);
  cuda::check_launch(op);
}

template <bool kMul, typename A>
void launch_binary_b(const A* a, const FloatPtr& b, const FloatPtr& o, int64_t n, cudaStream_t st,
                     const char* op) {
  if (b.f)
    launch_binary_o<kMul>(a, b.f, o, n, st, op);
  else
    launch_binary_o<kMul>(a, b.b, o, n, st, op);
}

template <bool kMul>
void binary(const char* op, const Tensor& a, const Tensor& b, const Tensor& out, cudaStream_t st) {
  if (a.numel() != b.numel() || a.numel() != out.numel())
    cuda::fail(op, "numel differs: a " + a.shape_str() + ", b " + b.shape_str() + ", out " + out.shape_str());
  const FloatPtr pa = float_ptr(a, op, "a"), pb = float_ptr(b, op, "b"), po = float_ptr(out, op, "out");
  const int64_t n = out.numel();
  if (n == 0) return;
  if (pa.b && pb.b && po.b && n % 8 == 0 && cuda::aligned16(pa.b) && cuda::aligned16(pb.b) &&
      cuda::aligned16(po.b)) {
    binary_bf16x8_kernel<kMul><<<cuda::blocks_for(n / 8, kThreads), kThreads, 0, st>>>(pa.b, pb.b, po.b, n / 8);
    cuda::check_launch(op);
    return;
  }
  if (pa.f)
    launch_binary_b<kMul>(pa.f, pb, po, n, st, op);
  else
    launch_binary_b<kMul>(pa.b, pb, po, n, st, op);
}

}  // namespace

void CudaOps::zero(const Tensor& t) {
  expect_cuda(t, "zero", "t");
  if (t.numel() == 0) return;
  cuda::check(cudaMemsetAsync(t.data, 0, t.bytes(), ctx_->stream), "zero", "cudaMemsetAsync");
}

void CudaOps::copy(const Tensor& src, const Tensor& dst) {
  const char* op = "copy";
  if (src.numel() != dst.numel())
    cuda::fail(op, "numel differs: src " + src.shape_str() + ", dst " + dst.shape_str());
  expect_cuda(src, op, "src");
  expect_cuda(dst, op, "dst");
  const int64_t n = src.numel();
  if (n == 0) return;
  if (src.dtype == dst.dtype) {
    if (src.data == dst.data) return;
    const char* s = static_cast<const char*>(src.data);
    const char* d = static_cast<const char*>(dst.data);
    const size_t bytes = src.bytes();
    if (s < d + bytes && d < s + bytes) cuda::fail(op, "src and dst overlap partially");
    cuda::check(cudaMemcpyAsync(dst.data, src.data, bytes, cudaMemcpyDeviceToDevice, ctx_->stream), op,
                "cudaMemcpyAsync");
    return;
  }
  if (src.dtype == DType::F32 && dst.dtype == DType::BF16) {
    launch_convert(cuda::f32(src, op, "src"), cuda::bf16p(dst, op, "dst"), n, ctx_->stream);
  } else if (src.dtype == DType::BF16 && dst.dtype == DType::F32) {
    launch_convert(cuda::bf16p(src, op, "src"), cuda::f32(dst, op, "dst"), n, ctx_->stream);
  } else {
    cuda::fail(op, std::string("unsupported conversion ") + dtype_name(src.dtype) + " -> " + dtype_name(dst.dtype));
  }
}

void CudaOps::add(const Tensor& a, const Tensor& b, const Tensor& out) {
  binary<false>("add", a, b, out, ctx_->stream);
}

void CudaOps::mul(const Tensor& a, const Tensor& b, const Tensor& out) {
  binary<true>("mul", a, b, out, ctx_->stream);
}

void CudaOps::scale(const Tensor& t, float s) {
  const FloatPtr p = float_ptr(t, "scale", "t");
  const int64_t n = t.numel();
  if (n == 0) return;
  if (p.f)
    scale_kernel<<<cuda::blocks_for(n, kThreads), kThreads, 0, ctx_->stream>>>(p.f, s, n);
  else
    scale_kernel<<<cuda::blocks_for(n, kThreads), kThreads, 0, ctx_->stream>>>(p.b, s, n);
  cuda::check_launch("scale");
}

void CudaOps::sum_squares(const Tensor& t, const Tensor& acc) {
  const char* op = "sum_squares";
  const FloatPtr p = float_ptr(t, op, "t");
  float* a = cuda::f32(acc, op, "acc");
  if (acc.numel() < 1) cuda::fail(op, "acc is empty");
  const int64_t n = t.numel();
  if (n == 0) return;
  const int64_t want = (n + kThreads - 1) / kThreads;
  const int nblocks = static_cast<int>(want < kSumSqMaxBlocks ? want : kSumSqMaxBlocks);
  auto* partials = static_cast<double*>(ctx_->scratch("sum_squares", sizeof(double) * kSumSqMaxBlocks));
  if (p.f)
    sum_squares_partial_kernel<<<nblocks, kThreads, 0, ctx_->stream>>>(p.f, n, partials);
  else
    sum_squares_partial_kernel<<<nblocks, kThreads, 0, ctx_->stream>>>(p.b, n, partials);
  cuda::check_launch(op);
  sum_squares_final_kernel<<<1, kThreads, 0, ctx_->stream>>>(partials, nblocks, a);
  cuda::check_launch(op);
}

void CudaOps::sum_values(const float* x, int64_t n, float* acc, const char* op) {
  if (n <= 0) return;
  const int64_t want = (n + kThreads - 1) / kThreads;
  const int nblocks = static_cast<int>(want < kSumSqMaxBlocks ? want : kSumSqMaxBlocks);
  auto* partials = static_cast<double*>(ctx_->scratch("sum_squares", sizeof(double) * kSumSqMaxBlocks));
  sum_squares_partial_kernel<float, false><<<nblocks, kThreads, 0, ctx_->stream>>>(x, n, partials);
  cuda::check_launch(op);
  sum_squares_final_kernel<<<1, kThreads, 0, ctx_->stream>>>(partials, nblocks, acc);
  cuda::check_launch(op);
}

}  // namespace mxt
