// Rotary position embedding, in place on BF16 x [T, n_heads, head_dim], mirroring HF's rounding:
//   inv_freq[i] = 1 / theta^(2i/D)           fp32, computed on the host exactly as HF / the CPU twin do
//   a = float(pos) * inv_freq[i]             fp32
//   c = bf16(cos a), s = bf16(sin a)         (HF: cos.to(x.dtype), sin.to(x.dtype))
//   x'[i]   = bf16( bf16(x[i] * c)   - bf16(x[i+h] * s) )      (q * cos + rotate_half(q) * sin, in bf16)
//   x'[i+h] = bf16( bf16(x[i+h] * c) + bf16(x[i] * s) )
// The backward applies the transpose rotation (s -> -s), which is what autograd computes through those
// bf16 products: dx[i] = bf16(dy[i] c) + bf16(dy[i+h] s), dx[i+h] = bf16(dy[i+h] c) - bf16(dy[i] s).
// head_dim a multiple of 16 (every model shape) takes the 16-byte vector kernel; the arithmetic is the same.
#include <cmath>
#include <string>

#include "cuda_common.cuh"
#include "cuda_context.cuh"
#include "cuda_ops.hpp"

namespace mxt {

namespace {

using cuda::bf16;

constexpr int kThreads = 256;
constexpr int kMaxHalf = 256;  // head_dim <= 512

struct InvFreq {
  float v[kMaxHalf];
};

__device__ __forceinline__ float round_bf16(float v) { return __bfloat162float(__float2bfloat16(v)); }

// The token's bf16-rounded cos / sign * sin into shared memory, between barriers (the previous token's values
// are no longer read when they are overwritten).
__device__ __forceinline__ void token_cos_sin(float* cs, float* sn, int32_t pos, const InvFreq& inv_freq, float sign,
                                              int half) {
  __syncthreads();
  const float p = static_cast<float>(pos);
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const float a = __fmul_rn(p, inv_freq.v[i]);
    float s, c;
    sincosf(a, &s, &c);
    cs[i] = round_bf16(c);
    sn[i] = sign * round_bf16(s);
  }
  __syncthreads();
}

// One block per token (grid-stride): cos/sin of the token's angles into shared memory, then all heads.
__global__ void rope_kernel(bf16* __restrict__ x, const int32_t* __restrict__ pos, const InvFreq inv_freq,
                            float sign, int64_t T, int64_t H, int half) {
  __shared__ float cs[kMaxHalf], sn[kMaxHalf];
  const int64_t D = 2 * static_cast<int64_t>(half);
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    token_cos_sin(cs, sn, pos[t], inv_freq, sign, half);
    bf16* xt = x + t * H * D;
    const int64_t pairs = H * half;
    for (int64_t k = threadIdx.x; k < pairs; k += blockDim.x) {
      const int64_t h = k / half;
      const int i = static_cast<int>(k - h * half);
      bf16* r = xt + h * D;
      const float x1 = __bfloat162float(r[i]), x2 = __bfloat162float(r[i + half]);
      const float c = cs[i], s = sn[i];
      r[i] = __float2bfloat16(__fsub_rn(round_bf16(__fmul_rn(x1, c)), round_bf16(__fmul_rn(x2, s))));
      r[i + half] = __float2bfloat16(__fadd_rn(round_bf16(__fmul_rn(x2, c)), round_bf16(__fmul_rn(x1, s))));
    }
  }
}

// The same arithmetic with 16-byte accesses (half % 8 == 0, x 16-byte aligned), one thread per (token, group of 8
// pairs, chunk of kChunk heads): its chunk's loads first, its 8 angles' cos / sin while they arrive, then the
// chunk's heads. One block per token left most threads idle and synchronised twice per token at the model shapes
// (28 us for q + k at 8x1B, about twice their bytes' time; docs/perf.md, session 26); loading and storing head
// by head ran at 0.61 (q) and 0.33 (k) of the copy rate at 8x7B (bench_memops, session 38). Consecutive threads
// take consecutive groups, so a warp's accesses are whole 128-byte runs of a head. Idx: 32-bit index arithmetic
// where the thread count allows it.
constexpr int kChunk = 4;

template <typename Idx>
__global__ void rope_vec_kernel(bf16* __restrict__ x, const int32_t* __restrict__ pos, const InvFreq inv_freq,
                                float sign, int64_t T, int64_t H, int half) {
  const Idx groups = static_cast<Idx>(half / 8), chunks = static_cast<Idx>((H + kChunk - 1) / kChunk);
  const Idx n = static_cast<Idx>(T) * chunks * groups;
  const Idx stride = static_cast<Idx>(gridDim.x) * blockDim.x;
  const int64_t D = 2 * static_cast<int64_t>(half);
  for (Idx k = static_cast<Idx>(blockIdx.x) * blockDim.x + threadIdx.x; k < n; k += stride) {
    const int i0 = static_cast<int>(k % groups) * 8;
    const Idx rest = k / groups, t = rest / chunks, h0 = (rest % chunks) * kChunk;
    bf16* row = x + (static_cast<int64_t>(t) * H + h0) * D;
    uint4 a[kChunk], b[kChunk];
#pragma unroll
    for (int q = 0; q < kChunk; ++q) {
      if (h0 + q < H) {
        a[q] = *reinterpret_cast<const uint4*>(row + q * D + i0);
        b[q] = *reinterpret_cast<const uint4*>(row + q * D + i0 + half);
      }
    }
    const float p = static_cast<float>(pos[t]);
    float cs[8], sn[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      float s, c;
      sincosf(__fmul_rn(p, inv_freq.v[i0 + j]), &s, &c);
      cs[j] = round_bf16(c);
      sn[j] = sign * round_bf16(s);
    }
#pragma unroll
    for (int q = 0; q < kChunk; ++q) {
      if (h0 + q >= H) break;
      float x1[8], x2[8], o1[8], o2[8];
      cuda::unpack8(a[q], x1);
      cuda::unpack8(b[q], x2);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        o1[j] = __fsub_rn(round_bf16(__fmul_rn(x1[j], cs[j])), round_bf16(__fmul_rn(x2[j], sn[j])));
        o2[j] = __fadd_rn(round_bf16(__fmul_rn(x2[j], cs[j])), round_bf16(__fmul_rn(x1[j], sn[j])));
      }
      cuda::store8(row + q * D + i0, o1);
      cuda::store8(row + q * D + i0 + half, o2);
    }
  }
}

void rope_apply(CudaContext& ctx, const Tensor& x, const Tensor& pos, float theta, float sign, const char* op) {
  bf16* xp = cuda::bf16p(x, op, "x");
  const int32_t* pp = cuda::i32(pos, op, "pos");
  if (x.ndim != 3) cuda::fail(op, "x must be [T, n_heads, head_dim], got " + x.shape_str());
  const int64_t T = x.shape[0], H = x.shape[1], D = x.shape[2];
  if (D % 2) cuda::fail(op, "head_dim must be even, got " + std::to_string(D));
  if (D / 2 > kMaxHalf) cuda::fail(op, "head_dim " + std::to_string(D) + " exceeds " + std::to_string(2 * kMaxHalf));
  cuda::expect_numel(pos, T, op, "pos");
  if (T == 0 || H == 0 || D == 0) return;
  const int half = static_cast<int>(D / 2);
  // Same expression as the CPU twin and HF (1.0 / base ** (arange(0, D, 2).float() / D), all fp32).
  InvFreq inv{};
  for (int i = 0; i < half; ++i)
    inv.v[i] = 1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(D));
  if (half % 8 == 0 && cuda::aligned16(xp)) {
    const int64_t threads = T * ((H + kChunk - 1) / kChunk) * (half / 8);
    const unsigned grid = cuda::blocks_for(threads, kThreads);
    if (threads + static_cast<int64_t>(grid) * kThreads < (int64_t{1} << 32))
      rope_vec_kernel<uint32_t><<<grid, kThreads, 0, ctx.stream>>>(xp, pp, inv, sign, T, H, half);
    else
      rope_vec_kernel<int64_t><<<grid, kThreads, 0, ctx.stream>>>(xp, pp, inv, sign, T, H, half);
  } else {
    const unsigned grid = static_cast<unsigned>(T < 65535 * 16 ? T : 65535 * 16);
    rope_kernel<<<grid, kThreads, 0, ctx.stream>>>(xp, pp, inv, sign, T, H, half);
  }
  cuda::check_launch(op);
}

}  // namespace

void CudaOps::rope_forward(const Tensor& x, const Tensor& pos, float theta) {
  rope_apply(*ctx_, x, pos, theta, 1.f, "rope_forward");
}

void CudaOps::rope_backward(const Tensor& dx, const Tensor& pos, float theta) {
  rope_apply(*ctx_, dx, pos, theta, -1.f, "rope_backward");
}

}  // namespace mxt
