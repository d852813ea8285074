// MXFP8 grouped GEMMs: the entry points, and the baseline kernels (simple, correct: mma.sync m16n8k32 FP8
// tensor-core steps with the per-32-block scale promotion on the CUDA cores). The entry points try the Hopper
// kernels first (mxfp8_grouped_gemm_sm90.cu) and use the baseline elsewhere (other GPUs, shapes the sm90 path does
// not take, MXTRAIN_MXFP8_GEMM=baseline); the tests use the baseline as the GPU oracle of the fast path.
// CPU twins: mxfp8::grouped_gemm_ref / grouped_gemm_wgrad_ref.
//
// Both operands are K-major MXFP8 views (mxfp8.hpp): A [M][K], B [N][K] (per group), scales [rows][K/32].
// One m16n8k32 MMA covers exactly one MX block along K, so every MMA starts from a zero accumulator and its
// result is promoted: acc += (scale_a[row] * scale_b[col]) * tmp. The scale product is a power of two (exact
// unless it leaves the fp32 range: 2^(ea+eb-254) below 2^-149 or above 2^127, which no real tensor pair reaches).
// NaN blocks (scale 0xFF) give NaN outputs, as the fp64 reference does.
//
//   grouped along M (forward, dgrad): rows m in [off[e], off[e+1]) of A use group e of B; C [M, N] BF16 or F32
//     is overwritten; rows past off[E] (capacity padding) are zeroed.
//   grouped along K (wgrad): C[e] [M, N] F32 += sum over k in [off[e], off[e+1]) of A(:, k) B(:, k)^T; group
//     boundaries need not be multiples of 32 (bytes outside the group are zeroed as they are loaded, so a block
//     straddling two groups contributes only its own part).
// Offsets live on the device and are never read on the host (clamped into range on the device).
//
// Tiling: a block of 4 warps computes a 64 x 64 tile, each warp 32 x 32 (2 x 4 MMAs of 16 x 8). K runs in
// stages of 128 bytes (4 MX blocks) staged in shared memory; the next stage is fetched into registers while
// the current one is computed. Shared rows are 160 bytes apart so the 8-byte fragment loads of a half-warp
// (4 rows x 32 bytes) hit distinct banks.
//
// Fragment layout: the MMA's own K order within a 32-step is irrelevant as long as A and B agree, so thread
// t of a quad takes K bytes [8t, 8t + 8) with one 8-byte load: A regs {0, 2} = row g bytes [8t, 8t+4) and
// [8t+4, 8t+8), regs {1, 3} the same for row g + 8; B regs {0, 1} = column g, the same two halves. This
// pairs A reg 0 with B reg 0 and A reg 2 with B reg 1 on equal K, which is what m16n8k32 requires.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cuda_common.cuh"
#include "cuda_context.cuh"
#include "cuda_ops.hpp"
#include "mxfp8_cuda.hpp"

namespace mxt::mxfp8 {

namespace {

constexpr int BM = 64, BN = 64, BK = 128, kThreads = 128;
constexpr int kRowBytes = BK + 32;   // 160: conflict-free 8-byte fragment loads
constexpr int kKB = BK / kBlock;     // MX blocks per stage
constexpr int kChunks = BM * BK / 16 / kThreads;  // 16-byte chunks per thread per operand (4)
constexpr int kScalesPerThread = BM * kKB / kThreads;  // 2
static_assert(BM == BN, "A and B tiles share the staging code");

struct __align__(16) Smem {
  uint8_t a[BM * kRowBytes];
  uint8_t b[BN * kRowBytes];
  float sa[BM][kKB];
  float sb[BN][kKB];
};

// One operand's slice of a stage, held in registers between fetch and commit.
struct Staged {
  uint4 v[kChunks];
  float s[kScalesPerThread];
};

__device__ __forceinline__ int32_t clamp_to(int32_t v, int64_t hi) {
  return v < 0 ? 0 : (v > hi ? static_cast<int32_t>(hi) : v);
}

// Rows [row0, row0 + 64) (valid below row_end) of a K-major operand, K bytes [k0, k0 + 128) (valid in
// [klo, khi)); invalid bytes and scales come out as zero.
__device__ __forceinline__ void fetch(const uint8_t* __restrict__ data, const uint8_t* __restrict__ scales,
                                      int64_t K, int64_t row0, int64_t row_end, int64_t k0, int64_t klo,
                                      int64_t khi, Staged& st) {
#pragma unroll
  for (int i = 0; i < kChunks; ++i) {
    const int idx = threadIdx.x + i * kThreads;
    const int r = idx / (BK / 16), ch = idx % (BK / 16);
    const int64_t row = row0 + r, k = k0 + ch * 16;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (row < row_end && k < khi && k + 16 > klo) {
      v = __ldg(reinterpret_cast<const uint4*>(data + row * K + k));
      if (k < klo || k + 16 > khi) {  // a group boundary inside this chunk (wgrad only)
        union {
          uint4 u;
          uint8_t b[16];
        } m;
        m.u = v;
#pragma unroll
        for (int j = 0; j < 16; ++j)
          if (k + j < klo || k + j >= khi) m.b[j] = 0;
        v = m.u;
      }
    }
    st.v[i] = v;
  }
#pragma unroll
  for (int i = 0; i < kScalesPerThread; ++i) {
    const int idx = threadIdx.x + i * kThreads;
    const int r = idx / kKB, kb = idx % kKB;
    const int64_t row = row0 + r, k = k0 + kb * kBlock;
    st.s[i] = (row < row_end && k < khi && k + kBlock > klo) ? scale_value(scales[row * (K / kBlock) + k / kBlock])
                                                              : 0.f;
  }
}

__device__ __forceinline__ void commit(const Staged& st, uint8_t* tile, float (*sc)[kKB]) {
#pragma unroll
  for (int i = 0; i < kChunks; ++i) {
    const int idx = threadIdx.x + i * kThreads;
    const int r = idx / (BK / 16), ch = idx % (BK / 16);
    *reinterpret_cast<uint4*>(tile + r * kRowBytes + ch * 16) = st.v[i];
  }
#pragma unroll
  for (int i = 0; i < kScalesPerThread; ++i) {
    const int idx = threadIdx.x + i * kThreads;
    sc[idx / kKB][idx % kKB] = st.s[i];
  }
}

template <Format FA, Format FB>
__device__ __forceinline__ void mma_fp8(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  const float z = 0.f;
  if constexpr (FA == Format::E4M3 && FB == Format::E4M3) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%10,%10,%10,%10};\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(z));
  } else if constexpr (FA == Format::E4M3 && FB == Format::E5M2) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e5m2.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%10,%10,%10,%10};\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(z));
  } else if constexpr (FA == Format::E5M2 && FB == Format::E4M3) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e5m2.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%10,%10,%10,%10};\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(z));
  } else {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e5m2.e5m2.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%10,%10,%10,%10};\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(z));
  }
#else
  d[0] = d[1] = d[2] = d[3] = 0.f;
  __trap();
#endif
}

// The stage in shared memory (nkb MX blocks of it hold data) into acc[mi][ni][4].
template <Format FA, Format FB>
__device__ __forceinline__ void compute_stage(const Smem& sm, int nkb, float (&acc)[2][4][4]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = (warp / 2) * 32, wn = (warp % 2) * 32, g = lane / 4, t = lane % 4;
  for (int kb = 0; kb < nkb; ++kb) {
    uint32_t af[2][4], bfr[4][2];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi) {
      const uint8_t* p = sm.a + (wm + mi * 16 + g) * kRowBytes + kb * kBlock + 8 * t;
      const uint2 lo = *reinterpret_cast<const uint2*>(p);
      const uint2 hi = *reinterpret_cast<const uint2*>(p + 8 * kRowBytes);
      af[mi][0] = lo.x;
      af[mi][1] = hi.x;
      af[mi][2] = lo.y;
      af[mi][3] = hi.y;
    }
#pragma unroll
    for (int ni = 0; ni < 4; ++ni) {
      const uint2 v = *reinterpret_cast<const uint2*>(sm.b + (wn + ni * 8 + g) * kRowBytes + kb * kBlock + 8 * t);
      bfr[ni][0] = v.x;
      bfr[ni][1] = v.y;
    }
#pragma unroll
    for (int mi = 0; mi < 2; ++mi) {
      const float sa0 = sm.sa[wm + mi * 16 + g][kb], sa1 = sm.sa[wm + mi * 16 + g + 8][kb];
#pragma unroll
      for (int ni = 0; ni < 4; ++ni) {
        const float sb0 = sm.sb[wn + ni * 8 + 2 * t][kb], sb1 = sm.sb[wn + ni * 8 + 2 * t + 1][kb];
        float d[4];
        mma_fp8<FA, FB>(d, af[mi], bfr[ni]);
        acc[mi][ni][0] = fmaf(d[0], sa0 * sb0, acc[mi][ni][0]);
        acc[mi][ni][1] = fmaf(d[1], sa0 * sb1, acc[mi][ni][1]);
        acc[mi][ni][2] = fmaf(d[2], sa1 * sb0, acc[mi][ni][2]);
        acc[mi][ni][3] = fmaf(d[3], sa1 * sb1, acc[mi][ni][3]);
      }
    }
  }
}

// C tile (rows a_row0.., cols b_row0..) = sum over K bytes [klo, khi) of A rows [a_row0, a_end) times B rows
// [b_row0, b_end), into acc (zeroed here). klo is rounded down to an MX block; bytes below klo are masked.
template <Format FA, Format FB>
__device__ void tile_product(Smem& sm, const uint8_t* a, const uint8_t* as, int64_t a_row0, int64_t a_end,
                             const uint8_t* b, const uint8_t* bs, int64_t b_row0, int64_t b_end, int64_t K,
                             int64_t klo, int64_t khi, float (&acc)[2][4][4]) {
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int ni = 0; ni < 4; ++ni)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[mi][ni][j] = 0.f;
  const int64_t kstart = klo / kBlock * kBlock;
  if (khi <= klo) return;
  Staged sa, sb;
  fetch(a, as, K, a_row0, a_end, kstart, klo, khi, sa);
  fetch(b, bs, K, b_row0, b_end, kstart, klo, khi, sb);
  for (int64_t k0 = kstart; k0 < khi; k0 += BK) {
    __syncthreads();  // the previous stage has been read
    commit(sa, sm.a, sm.sa);
    commit(sb, sm.b, sm.sb);
    __syncthreads();
    if (k0 + BK < khi) {  // prefetch the next stage while this one is computed
      fetch(a, as, K, a_row0, a_end, k0 + BK, klo, khi, sa);
      fetch(b, bs, K, b_row0, b_end, k0 + BK, klo, khi, sb);
    }
    const int64_t left = (khi - k0 + kBlock - 1) / kBlock;
    compute_stage<FA, FB>(sm, left < kKB ? static_cast<int>(left) : kKB, acc);
  }
}

template <typename T>
__device__ __forceinline__ void store_out(T* c, int64_t i, float v);
template <>
__device__ __forceinline__ void store_out<float>(float* c, int64_t i, float v) {
  c[i] = v;
}
template <>
__device__ __forceinline__ void store_out<cuda::bf16>(cuda::bf16* c, int64_t i, float v) {
  c[i] = __float2bfloat16_rn(v);
}

// Forward / dgrad: blockIdx.x walks the (expert, row tile) pairs, then the padding tiles; blockIdx.y the
// column tiles.
template <Format FA, Format FB, typename TC>
__global__ void __launch_bounds__(kThreads)
    grouped_m_kernel(const uint8_t* __restrict__ a, const uint8_t* __restrict__ as, const uint8_t* __restrict__ b,
                     const uint8_t* __restrict__ bs, const int32_t* __restrict__ off, int E, int64_t M, int64_t N,
                     int64_t K, TC* __restrict__ c) {
  __shared__ Smem sm;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * BN;
  int64_t tile = blockIdx.x, cum = 0;
  int expert = -1;
  int64_t row0 = 0, row_end = 0;
  for (int e = 0; e < E && expert < 0; ++e) {
    const int64_t lo = clamp_to(off[e], M);
    int64_t hi = clamp_to(off[e + 1], M);
    if (hi < lo) hi = lo;
    const int64_t tiles = (hi - lo + BM - 1) / BM;
    if (tile < cum + tiles) {
      expert = e;
      row0 = lo + (tile - cum) * BM;
      row_end = hi;
    }
    cum += tiles;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = (warp / 2) * 32, wn = (warp % 2) * 32, g = lane / 4, t = lane % 4;
  if (expert < 0) {  // a padding tile: zero rows used + p * BM ... of [off[E], M)
    const int64_t used = clamp_to(off[E], M);
    const int64_t p0 = used + (tile - cum) * BM;
    for (int idx = threadIdx.x; idx < BM * BN; idx += kThreads) {
      const int64_t r = p0 + idx / BN, n = n0 + idx % BN;
      if (r >= used && r < M && n < N) store_out(c, r * N + n, 0.f);
    }
    return;
  }
  float acc[2][4][4];
  tile_product<FA, FB>(sm, a, as, row0, row_end, b + expert * N * K, bs + expert * N * (K / kBlock), n0, N, K, 0,
                       K, acc);
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int ni = 0; ni < 4; ++ni)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t r = row0 + wm + mi * 16 + g + (j >= 2 ? 8 : 0);
        const int64_t n = n0 + wn + ni * 8 + 2 * t + (j & 1);
        if (r < row_end && n < N) store_out(c, r * N + n, acc[mi][ni][j]);
      }
}

// Wgrad: grid (N tiles, M tiles, E); C[e] += this block's tile over group e's K range.
template <Format FA, Format FB>
__global__ void __launch_bounds__(kThreads)
    grouped_k_kernel(const uint8_t* __restrict__ a, const uint8_t* __restrict__ as, const uint8_t* __restrict__ b,
                     const uint8_t* __restrict__ bs, const int32_t* __restrict__ off, int64_t M, int64_t N,
                     int64_t K, float* __restrict__ c) {
  __shared__ Smem sm;
  const int e = blockIdx.z;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * BN, m0 = static_cast<int64_t>(blockIdx.y) * BM;
  const int64_t klo = clamp_to(off[e], K);
  int64_t khi = clamp_to(off[e + 1], K);
  if (khi <= klo) return;  // an empty group adds nothing
  float acc[2][4][4];
  tile_product<FA, FB>(sm, a, as, m0, M, b, bs, n0, N, K, klo, khi, acc);
  float* ce = c + static_cast<int64_t>(e) * M * N;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = (warp / 2) * 32, wn = (warp % 2) * 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int ni = 0; ni < 4; ++ni)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t r = m0 + wm + mi * 16 + g + (j >= 2 ? 8 : 0);
        const int64_t n = n0 + wn + ni * 8 + 2 * t + (j & 1);
        if (r < M && n < N) ce[r * N + n] += acc[mi][ni][j];
      }
}

// ---- host side ----------------------------------------------------------------------------------------------

void check_operand(const MxView& v, const char* op, const char* arg) {
  const std::string what = std::string(op) + ": " + arg;
  if (v.device != Device::CUDA) throw std::invalid_argument(what + " is not a CUDA view");
  check_shape(v.batch, v.rows, v.cols, v.dir, op);
  if (v.data_bytes() > 0 && (!v.data || !v.scales)) throw std::invalid_argument(what + " has no buffers");
  if (reinterpret_cast<uintptr_t>(v.data) % 16 != 0) throw std::invalid_argument(what + " data must be 16-byte aligned");
}

void check_offsets_tensor(const Tensor& off, int64_t E, const char* op) {
  if (off.device != Device::CUDA || off.dtype != DType::I32 || off.numel() != E + 1)
    throw std::invalid_argument(std::string(op) + ": offsets must be a CUDA I32 tensor of " + std::to_string(E + 1) +
                                " elements, got " + dtype_name(off.dtype) + " " + off.shape_str());
}

template <typename F>
void dispatch_formats(Format fa, Format fb, F&& f) {
  if (fa == Format::E4M3 && fb == Format::E4M3) f(std::integral_constant<Format, Format::E4M3>{},
                                                  std::integral_constant<Format, Format::E4M3>{});
  else if (fa == Format::E4M3) f(std::integral_constant<Format, Format::E4M3>{},
                                 std::integral_constant<Format, Format::E5M2>{});
  else if (fb == Format::E4M3) f(std::integral_constant<Format, Format::E5M2>{},
                                 std::integral_constant<Format, Format::E4M3>{});
  else f(std::integral_constant<Format, Format::E5M2>{}, std::integral_constant<Format, Format::E5M2>{});
}

// Checks the arguments; false when there is nothing to compute.
bool check_grouped_m(const char* op, const MxView& A, const MxView& B, const Tensor& offsets, const Tensor& C) {
  check_operand(A, op, "A");
  check_operand(B, op, "B");
  if (A.batch != 1) throw std::invalid_argument(std::string(op) + ": A must have batch 1");
  if (A.op_k() != B.op_k())
    throw std::invalid_argument(std::string(op) + ": contraction dims differ: A has K=" + std::to_string(A.op_k()) +
                                ", B has K=" + std::to_string(B.op_k()));
  const int64_t M = A.op_rows(), N = B.op_rows(), E = B.batch;
  check_offsets_tensor(offsets, E, op);
  if (C.device != Device::CUDA || (C.dtype != DType::BF16 && C.dtype != DType::F32) || C.numel() != M * N)
    throw std::invalid_argument(std::string(op) + ": C must be a CUDA BF16 or F32 tensor of " + std::to_string(M) +
                                " x " + std::to_string(N) + " elements, got " + dtype_name(C.dtype) + " " +
                                C.shape_str());
  return M > 0 && N > 0;
}

void baseline_m(CudaOps& ops, const MxView& A, const MxView& B, const Tensor& offsets, const Tensor& C) {
  const char* op = "mxfp8::grouped_gemm_cuda (baseline)";
  const int64_t M = A.op_rows(), N = B.op_rows(), K = A.op_k(), E = B.batch;
  const int64_t xt = (M + BM - 1) / BM + E, yt = (N + BN - 1) / BN;
  if (xt > 0x7FFFFFFF || yt > 65535) throw std::invalid_argument(std::string(op) + ": problem too large");
  const dim3 grid(static_cast<unsigned>(xt), static_cast<unsigned>(yt));
  cudaStream_t st = ops.ctx().stream;
  const int32_t* off = static_cast<const int32_t*>(offsets.data);
  dispatch_formats(A.format, B.format, [&](auto fa, auto fb) {
    constexpr Format FA = decltype(fa)::value, FB = decltype(fb)::value;
    if (C.dtype == DType::BF16) {
      grouped_m_kernel<FA, FB, cuda::bf16><<<grid, kThreads, 0, st>>>(A.data, A.scales, B.data, B.scales, off,
                                                                      static_cast<int>(E), M, N, K,
                                                                      static_cast<cuda::bf16*>(C.data));
    } else {
      grouped_m_kernel<FA, FB, float><<<grid, kThreads, 0, st>>>(A.data, A.scales, B.data, B.scales, off,
                                                                 static_cast<int>(E), M, N, K,
                                                                 static_cast<float*>(C.data));
    }
  });
  cuda::check_launch(op);
}

bool check_grouped_k(const char* op, const MxView& A, const MxView& B, const Tensor& offsets, const Tensor& C) {
  check_operand(A, op, "A");
  check_operand(B, op, "B");
  if (A.batch != 1 || B.batch != 1) throw std::invalid_argument(std::string(op) + ": A and B must have batch 1");
  if (A.op_k() != B.op_k())
    throw std::invalid_argument(std::string(op) + ": contraction dims differ: A has K=" + std::to_string(A.op_k()) +
                                ", B has K=" + std::to_string(B.op_k()));
  const int64_t M = A.op_rows(), N = B.op_rows(), K = A.op_k(), E = offsets.numel() - 1;
  if (E < 1 || E > 65535) throw std::invalid_argument(std::string(op) + ": offsets needs 2 to 65536 entries");
  check_offsets_tensor(offsets, E, op);
  if (C.device != Device::CUDA || C.dtype != DType::F32 || C.numel() != E * M * N)
    throw std::invalid_argument(std::string(op) + ": C must be a CUDA F32 tensor of " + std::to_string(E) + " x " +
                                std::to_string(M) + " x " + std::to_string(N) + " elements, got " +
                                dtype_name(C.dtype) + " " + C.shape_str());
  return M > 0 && N > 0 && K > 0;
}

void baseline_k(CudaOps& ops, const MxView& A, const MxView& B, const Tensor& offsets, const Tensor& C) {
  const char* op = "mxfp8::grouped_gemm_wgrad_cuda (baseline)";
  const int64_t M = A.op_rows(), N = B.op_rows(), K = A.op_k(), E = offsets.numel() - 1;
  const int64_t xt = (N + BN - 1) / BN, yt = (M + BM - 1) / BM;
  if (xt > 0x7FFFFFFF || yt > 65535) throw std::invalid_argument(std::string(op) + ": problem too large");
  const dim3 grid(static_cast<unsigned>(xt), static_cast<unsigned>(yt), static_cast<unsigned>(E));
  cudaStream_t st = ops.ctx().stream;
  const int32_t* off = static_cast<const int32_t*>(offsets.data);
  dispatch_formats(A.format, B.format, [&](auto fa, auto fb) {
    constexpr Format FA = decltype(fa)::value, FB = decltype(fb)::value;
    grouped_k_kernel<FA, FB><<<grid, kThreads, 0, st>>>(A.data, A.scales, B.data, B.scales, off, M, N, K,
                                                        static_cast<float*>(C.data));
  });
  cuda::check_launch(op);
}

}  // namespace

void grouped_gemm_cuda(CudaOps& ops, const MxView& A, const MxView& B, const Tensor& offsets, const Tensor& C) {
  if (!check_grouped_m("mxfp8::grouped_gemm_cuda", A, B, offsets, C)) return;
  if (grouped_gemm_sm90(ops, A, B, offsets, C)) return;
  baseline_m(ops, A, B, offsets, C);
  note_gemm_impl("baseline");
}

void grouped_gemm_baseline_cuda(CudaOps& ops, const MxView& A, const MxView& B, const Tensor& offsets,
                                const Tensor& C) {
  if (!check_grouped_m("mxfp8::grouped_gemm_baseline_cuda", A, B, offsets, C)) return;
  baseline_m(ops, A, B, offsets, C);
  note_gemm_impl("baseline");
}

void grouped_gemm_wgrad_cuda(CudaOps& ops, const MxView& A, const MxView& B, const Tensor& offsets,
                             const Tensor& C) {
  if (!check_grouped_k("mxfp8::grouped_gemm_wgrad_cuda", A, B, offsets, C)) return;
  if (grouped_gemm_wgrad_sm90(ops, A, B, offsets, C)) return;
  baseline_k(ops, A, B, offsets, C);
  note_gemm_impl("baseline");
}

void grouped_gemm_wgrad_baseline_cuda(CudaOps& ops, const MxView& A, const MxView& B, const Tensor& offsets,
                                      const Tensor& C) {
  if (!check_grouped_k("mxfp8::grouped_gemm_wgrad_baseline_cuda", A, B, offsets, C)) return;
  baseline_k(ops, A, B, offsets, C);
  note_gemm_impl("baseline");
}

}  // namespace mxt::mxfp8
