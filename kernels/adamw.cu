// AdamW with torch.optim.AdamW semantics on an F32 param, an F32 or BF16 grad (expert_grad_dtype; widened exactly)
// and F32 or BF16 moments (adamw_moments_dtype), the
// same per-element fp32 expression (same operation order, no FMA contraction) and the same double-precision scalars
// as the CPU twin (src/cpu/adamw.cpp), so both give the same bits up to the libm/CUDA sqrt and division, which are
// both correctly rounded. BF16 moments are updated in fp32, used unrounded, and stored rounded to nearest even.
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "cuda_common.cuh"
#include "cuda_context.cuh"
#include "cuda_ops.hpp"

namespace mxt {

namespace {

constexpr int kThreads = 256;

struct AdamScalars {
  float grad_scale, b1, b2, one_minus_b1, one_minus_b2, step_size, bc2_sqrt, decay, eps;
};

__device__ __forceinline__ void adamw_one(float& p, float g, float& m, float& v, const AdamScalars& s) {
  const float gi = __fmul_rn(g, s.grad_scale);
  m = __fadd_rn(__fmul_rn(s.b1, m), __fmul_rn(s.one_minus_b1, gi));
  v = __fadd_rn(__fmul_rn(s.b2, v), __fmul_rn(__fmul_rn(s.one_minus_b2, gi), gi));
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), s.bc2_sqrt), s.eps);
  p = __fsub_rn(__fmul_rn(p, s.decay), __fdiv_rn(__fmul_rn(s.step_size, m), denom));
}

// A moment or grad element, or a group of four (16 bytes of f32, 8 of bf16), in fp32.
__device__ __forceinline__ float ld_wide(const float* m, int64_t i) { return m[i]; }
__device__ __forceinline__ float ld_wide(const cuda::bf16* m, int64_t i) { return __bfloat162float(m[i]); }
__device__ __forceinline__ void st_moment(float* m, int64_t i, float x) { m[i] = x; }
__device__ __forceinline__ void st_moment(cuda::bf16* m, int64_t i, float x) { m[i] = __float2bfloat16_rn(x); }
__device__ __forceinline__ float4 ld_wide4(const float* m, int64_t i4) {
  return reinterpret_cast<const float4*>(m)[i4];
}
__device__ __forceinline__ float4 ld_wide4(const cuda::bf16* m, int64_t i4) {
  const uint2 u = reinterpret_cast<const uint2*>(m)[i4];
  const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x));
  const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}
__device__ __forceinline__ void st_moment4(float* m, int64_t i4, float4 x) { reinterpret_cast<float4*>(m)[i4] = x; }
__device__ __forceinline__ void st_moment4(cuda::bf16* m, int64_t i4, float4 x) {
  const __nv_bfloat162 lo = __floats2bfloat162_rn(x.x, x.y), hi = __floats2bfloat162_rn(x.z, x.w);
  uint2 u;
  u.x = *reinterpret_cast<const uint32_t*>(&lo);
  u.y = *reinterpret_cast<const uint32_t*>(&hi);
  reinterpret_cast<uint2*>(m)[i4] = u;
}

// Writes the updated param to the working copy w (when there is one) for the elements below wn.
template <typename TW>
__device__ __forceinline__ void put_working(TW* w, int64_t wn, int64_t i, float p) {
  if (w != nullptr && i < wn) cuda::st(w, i, p);
}

// Group i4 of four updated params to the working copy: one 16-byte (f32) or 8-byte (bf16) store when w4 (w aligned
// to a group) and the whole group is below wn, else element by element: one store instruction instead of four (the
// 8x7B step writes 4 G working values; its AdamW measured 29.18 against 29.51 ms, within noise, session 30).
template <typename TW>
__device__ __forceinline__ void put_working4(TW* w, int64_t wn, int64_t i4, float4 pp, bool w4) {
  if (!w4 || 4 * i4 + 3 >= wn) {
    put_working(w, wn, 4 * i4, pp.x);
    put_working(w, wn, 4 * i4 + 1, pp.y);
    put_working(w, wn, 4 * i4 + 2, pp.z);
    put_working(w, wn, 4 * i4 + 3, pp.w);
  } else if constexpr (std::is_same_v<TW, float>) {
    reinterpret_cast<float4*>(w)[i4] = pp;
  } else {
    const __nv_bfloat162 lo = __floats2bfloat162_rn(pp.x, pp.y), hi = __floats2bfloat162_rn(pp.z, pp.w);
    uint2 u;
    u.x = *reinterpret_cast<const uint32_t*>(&lo);
    u.y = *reinterpret_cast<const uint32_t*>(&hi);
    reinterpret_cast<uint2*>(w)[i4] = u;
  }
}

// param and grad 16-byte aligned, m and v aligned to a group of four: four elements per thread and pass; the
// caller handles the n%4 tail with the scalar kernel.
template <typename TG, typename TM, typename TW>
__global__ void adamw_vec4_kernel(float4* __restrict__ p, const TG* __restrict__ g, TM* __restrict__ m,
                                  TM* __restrict__ v, int64_t n4, const AdamScalars s, TW* __restrict__ w,
                                  int64_t wn, bool w4) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n4; i += stride) {
    float4 pp = p[i], mm = ld_wide4(m, i), vv = ld_wide4(v, i);
    const float4 gg = ld_wide4(g, i);
    adamw_one(pp.x, gg.x, mm.x, vv.x, s);
    adamw_one(pp.y, gg.y, mm.y, vv.y, s);
    adamw_one(pp.z, gg.z, mm.z, vv.z, s);
    adamw_one(pp.w, gg.w, mm.w, vv.w, s);
    p[i] = pp;
    st_moment4(m, i, mm);
    st_moment4(v, i, vv);
    if (w != nullptr) put_working4(w, wn, i, pp, w4);
  }
}

template <typename TG, typename TM, typename TW>
__global__ void adamw_scalar_kernel(float* __restrict__ p, const TG* __restrict__ g, TM* __restrict__ m,
                                    TM* __restrict__ v, int64_t n, const AdamScalars s, TW* __restrict__ w,
                                    int64_t wn) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    float pi = p[i], mi = ld_wide(m, i), vi = ld_wide(v, i);
    adamw_one(pi, ld_wide(g, i), mi, vi, s);
    p[i] = pi;
    st_moment(m, i, mi);
    st_moment(v, i, vi);
    put_working(w, wn, i, pi);
  }
}

// A master held split (optimizer_store_param_remainders): the device twins of mxtrain/bf16.hpp's join_master and
// split_master (upper half rounded half away from zero, lower half as a signed remainder).
__device__ __forceinline__ float join_master(uint16_t hi, uint16_t lo) {
  const uint32_t up = (lo & 0x8000u) ? static_cast<uint16_t>(hi - 1u) : hi;
  return __uint_as_float((up << 16) | lo);
}
__device__ __forceinline__ void split_master(float f, uint16_t& hi, uint16_t& lo) {
  const uint32_t u = __float_as_uint(f);
  lo = static_cast<uint16_t>(u & 0xffffu);
  hi = static_cast<uint16_t>((u >> 16) + ((lo & 0x8000u) ? 1u : 0u));
}

// Four elements per thread and pass (hi and rem 8-byte groups, grad and moments as in adamw_vec4_kernel); the
// caller handles the n%4 tail and misaligned buffers with the scalar kernel.
template <typename TG, typename TM>
__global__ void adamw_split_vec4_kernel(uint2* __restrict__ hi, uint2* __restrict__ rem, const TG* __restrict__ g,
                                        TM* __restrict__ m, TM* __restrict__ v, int64_t n4, const AdamScalars s) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n4; i += stride) {
    const uint2 h = hi[i], r = rem[i];
    float4 mm = ld_wide4(m, i), vv = ld_wide4(v, i);
    const float4 gg = ld_wide4(g, i);
    float p[4] = {join_master(h.x & 0xffffu, r.x & 0xffffu), join_master(h.x >> 16, r.x >> 16),
                  join_master(h.y & 0xffffu, r.y & 0xffffu), join_master(h.y >> 16, r.y >> 16)};
    adamw_one(p[0], gg.x, mm.x, vv.x, s);
    adamw_one(p[1], gg.y, mm.y, vv.y, s);
    adamw_one(p[2], gg.z, mm.z, vv.z, s);
    adamw_one(p[3], gg.w, mm.w, vv.w, s);
    uint16_t ph[4], pl[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) split_master(p[k], ph[k], pl[k]);
    hi[i] = make_uint2(ph[0] | (static_cast<uint32_t>(ph[1]) << 16), ph[2] | (static_cast<uint32_t>(ph[3]) << 16));
    rem[i] = make_uint2(pl[0] | (static_cast<uint32_t>(pl[1]) << 16), pl[2] | (static_cast<uint32_t>(pl[3]) << 16));
    st_moment4(m, i, mm);
    st_moment4(v, i, vv);
  }
}

template <typename TG, typename TM>
__global__ void adamw_split_scalar_kernel(uint16_t* __restrict__ hi, uint16_t* __restrict__ rem,
                                          const TG* __restrict__ g, TM* __restrict__ m, TM* __restrict__ v,
                                          int64_t n, const AdamScalars s) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    float p = join_master(hi[i], rem[i]), mi = ld_wide(m, i), vi = ld_wide(v, i);
    adamw_one(p, ld_wide(g, i), mi, vi, s);
    split_master(p, hi[i], rem[i]);
    st_moment(m, i, mi);
    st_moment(v, i, vi);
  }
}

bool aligned(const void* ptr, size_t bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; }

// The step's scalars exactly as the CPU twin computes them.
AdamScalars scalars_of(const AdamWStep& s) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(s.beta1), static_cast<double>(s.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(s.beta2), static_cast<double>(s.step));
  AdamScalars sc{};
  sc.grad_scale = s.grad_scale;
  sc.b1 = s.beta1;
  sc.b2 = s.beta2;
  sc.one_minus_b1 = 1.f - s.beta1;
  sc.one_minus_b2 = 1.f - s.beta2;
  sc.step_size = static_cast<float>(s.lr / bc1);
  sc.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  sc.decay = static_cast<float>(1.0 - static_cast<double>(s.lr) * s.weight_decay);
  sc.eps = s.eps;
  return sc;
}

template <typename TG, typename TM>
void adamw_split_launch(uint16_t* hp, uint16_t* rp, const TG* gp, TM* mp, TM* vp, int64_t n, const AdamWStep& s,
                        cudaStream_t stream) {
  const char* op = "adamw_step_split";
  if (n == 0) return;
  const AdamScalars sc = scalars_of(s);
  int64_t done = 0;
  if (aligned(hp, 8) && aligned(rp, 8) && aligned(gp, 4 * sizeof(TG)) && aligned(mp, 4 * sizeof(TM)) &&
      aligned(vp, 4 * sizeof(TM)) && n >= 4) {
    const int64_t n4 = n / 4;
    adamw_split_vec4_kernel<<<cuda::blocks_for(n4, kThreads), kThreads, 0, stream>>>(
        reinterpret_cast<uint2*>(hp), reinterpret_cast<uint2*>(rp), gp, mp, vp, n4, sc);
    cuda::check_launch(op);
    done = n4 * 4;
  }
  if (done < n) {
    const int64_t rest = n - done;
    adamw_split_scalar_kernel<<<cuda::blocks_for(rest, kThreads), kThreads, 0, stream>>>(
        hp + done, rp + done, gp + done, mp + done, vp + done, rest, sc);
    cuda::check_launch(op);
  }
}

template <typename TG, typename TM, typename TW>
void adamw_launch(float* pp, const TG* gp, TM* mp, TM* vp, int64_t n, const AdamWStep& s, TW* w, int64_t wn,
                  cudaStream_t stream) {
  const char* op = "adamw_step";
  if (n == 0) return;
  const AdamScalars sc = scalars_of(s);

  int64_t done = 0;
  if (aligned(pp, 16) && aligned(gp, 4 * sizeof(TG)) && aligned(mp, 4 * sizeof(TM)) && aligned(vp, 4 * sizeof(TM)) &&
      n >= 4) {
    const int64_t n4 = n / 4;
    adamw_vec4_kernel<<<cuda::blocks_for(n4, kThreads), kThreads, 0, stream>>>(
        reinterpret_cast<float4*>(pp), gp, mp, vp, n4, sc, w, wn,
        aligned(w, 4 * sizeof(TW)));
    cuda::check_launch(op);
    done = n4 * 4;
  }
  if (done < n) {
    const int64_t rest = n - done;
    adamw_scalar_kernel<<<cuda::blocks_for(rest, kThreads), kThreads, 0, stream>>>(
        pp + done, gp + done, mp + done, vp + done, rest, sc, w ? w + done : nullptr, wn - done);
    cuda::check_launch(op);
  }
}

// The grad and moments of an n-element step, and the step number.
void check_step_args(const char* op, int64_t n, const Tensor& grad, const Tensor& m, const Tensor& v,
                     const AdamWStep& s) {
  cuda::expect_numel(grad, n, op, "grad");
  cuda::expect_numel(m, n, op, "m");
  cuda::expect_numel(v, n, op, "v");
  if (s.step < 1) cuda::fail(op, "step is 1-based, got " + std::to_string(s.step));
  if (m.dtype != v.dtype)
    cuda::fail(op, std::string("m and v differ in dtype: ") + dtype_name(m.dtype) + ", " + dtype_name(v.dtype));
}

// Checks the arguments and picks the moments' dtype (both alike, F32 or BF16).
template <typename TG, typename TW>
void adamw_moments(const Tensor& param, const TG* gp, const Tensor& grad, const Tensor& m, const Tensor& v,
                   const AdamWStep& s, TW* w, int64_t wn, cudaStream_t stream) {
  const char* op = "adamw_step";
  const int64_t n = param.numel();
  float* pp = cuda::f32(param, op, "param");
  check_step_args(op, n, grad, m, v, s);
  if (m.dtype == DType::BF16)
    adamw_launch(pp, gp, cuda::bf16p(m, op, "m"), cuda::bf16p(v, op, "v"), n, s, w, wn, stream);
  else
    adamw_launch(pp, gp, cuda::f32(m, op, "m"), cuda::f32(v, op, "v"), n, s, w, wn, stream);
}

// Picks the grad's dtype (F32 or BF16).
template <typename TW>
void adamw_grads(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, const AdamWStep& s,
                 TW* w, int64_t wn, cudaStream_t stream) {
  const char* op = "adamw_step";
  if (grad.dtype == DType::BF16)
    adamw_moments(param, cuda::bf16p(grad, op, "grad"), grad, m, v, s, w, wn, stream);
  else
    adamw_moments(param, cuda::f32(grad, op, "grad"), grad, m, v, s, w, wn, stream);
}

}  // namespace

void CudaOps::adamw_step_split(const Tensor& hi, const Tensor& rem, const Tensor& grad, const Tensor& m,
                               const Tensor& v, const AdamWStep& s) {
  const char* op = "adamw_step_split";
  const int64_t n = hi.numel();
  if (hi.dtype != DType::BF16 || rem.dtype != DType::I16)
    cuda::fail(op, std::string("hi and rem must be bf16 and i16, got ") + dtype_name(hi.dtype) + " and " +
                       dtype_name(rem.dtype));
  cuda::expect_numel(rem, n, op, "rem");
  check_step_args(op, n, grad, m, v, s);
  auto* hp = static_cast<uint16_t*>(hi.data);
  auto* rp = static_cast<uint16_t*>(rem.data);
  const cudaStream_t st = ctx_->stream;
  auto with_grad = [&](auto* mp, auto* vp) {
    if (grad.dtype == DType::BF16)
      adamw_split_launch(hp, rp, cuda::bf16p(grad, op, "grad"), mp, vp, n, s, st);
    else
      adamw_split_launch(hp, rp, cuda::f32(grad, op, "grad"), mp, vp, n, s, st);
  };
  if (m.dtype == DType::BF16)
    with_grad(cuda::bf16p(m, op, "m"), cuda::bf16p(v, op, "v"));
  else
    with_grad(cuda::f32(m, op, "m"), cuda::f32(v, op, "v"));
}

void CudaOps::adamw_step(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                         const AdamWStep& s) {
  adamw_grads<float>(param, grad, m, v, s, nullptr, 0, ctx_->stream);
}

void CudaOps::adamw_step_to(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                            const AdamWStep& s, const Tensor& working) {
  const char* op = "adamw_step_to";
  const int64_t wn = working.numel();
  if (wn > param.numel())
    cuda::fail(op, "working " + working.shape_str() + " is longer than param " + param.shape_str());
  if (wn > 0 && working.data == param.data) cuda::fail(op, "working aliases param");
  if (working.dtype == DType::BF16)
    adamw_grads(param, grad, m, v, s, wn ? cuda::bf16p(working, op, "working") : nullptr, wn, ctx_->stream);
  else
    adamw_grads(param, grad, m, v, s, wn ? cuda::f32(working, op, "working") : nullptr, wn, ctx_->stream);
}

}  // namespace mxt
