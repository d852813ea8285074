// Grouped expert GEMMs (CudaOps::grouped_gemm, grouped_gemm_dgrad, grouped_gemm_wgrad) on tensor cores through
// nvcuda::wmma (bf16 16x16x16, fp32 accumulate), one kernel launch per call. On Hopper each call first tries
// the TMA + wgmma kernels of grouped_gemm_sm90.cu (sm90_grouped_gemm.cuh says when they apply and how
// MXTRAIN_GROUPED_GEMM=wmma forces these); the kernels here are the fallback and the reference.
//
// Rows of x / dy are grouped by expert through offsets [E+1] I32, which live on the device and are never read
// on the host: every block derives its work from them.
//   forward  y[r,:]  = x[r,:] @ W[e]^T     x [R,in],  W [E,out,in] -> y  [R,out]   (overwrite)
//   dgrad    dx[r,:] = dy[r,:] @ W[e]      dy [R,out], W            -> dx [R,in]    (overwrite)
//   wgrad    dW[e]  += dy_e^T @ x_e        dy [R,out], x [R,in]     -> dW [E,out,in] F32 (accumulate)
// Rows past offsets[E] (capacity padding) come out as zeros in y / dx.
//
// Tiling (all three kernels): a block of 4 warps computes a BM x BN = 64 x 64 output tile; each warp owns a
// 32 x 32 quarter (2 x 2 wmma fragments). The contraction runs in chunks of BK = 32 staged in shared memory;
// loads are guarded (out-of-range elements are zero-filled), so any sizes work.
//
// Forward / dgrad grid: x = row tiles, an upper bound ceil(R/BM) + E of the real ones; y = column tiles. A
// block walks the experts (cumulative ceil(count_e / BM)) to find its (expert, row tile). Blocks past the real
// tiles zero the padding rows [offsets[E], R): there are always enough of them (see tile_count_bound).
// Wgrad grid: (in tiles, out tiles, E); each block loops over its expert's rows in chunks of BK and adds its
// fp32 tile into dW once (no atomics: deterministic).
//
// Offsets are assumed valid (the CPU twin checks them); on the device they are clamped into [0, R] so a bad
// table cannot cause out-of-bounds accesses.
#include <mma.h>

#include <cstdint>
#include <string>
#include <vector>
#include <type_traits>

#include "cuda_common.cuh"
#include "cuda_context.cuh"
#include "cuda_ops.hpp"
#include "sm90_grouped_gemm.cuh"

namespace mxt {

namespace {

using cuda::bf16;
namespace wmma = nvcuda::wmma;

constexpr int BM = 64, BN = 64, BK = 32;
constexpr int kThreads = 128;  // 4 warps in a 2 x 2 arrangement of 32 x 32 warp tiles
constexpr int kPad = 8;        // bf16 elements of row padding: keeps wmma's ldm a multiple of 8 and 32-byte rows
constexpr int kCPad = 4;       // float padding of the accumulator staging tile

// Shared memory. Operand tiles are stored either "m-major" ([m][k], row_major for matrix_a) or "k-major"
// ([k][m], col_major for matrix_a); likewise for B. Each is at most 64 x (32+8) or 32 x (64+8) bf16.
constexpr int kTileElems = (BM * (BK + kPad) > BK * (BM + kPad)) ? BM * (BK + kPad) : BK * (BM + kPad);
struct __align__(128) Smem {
  bf16 a[kTileElems];
  bf16 b[kTileElems];
  float c[BM * (BN + kCPad)];
};
static_assert(sizeof(Smem) <= 48 * 1024, "static shared memory limit");
static_assert((BM * (BK + kPad) * 2) % 128 == 0 && (BK * (BM + kPad) * 2) % 128 == 0, "tile alignment");
static_assert(BM == BN, "the tile buffers are shared between A and B layouts");

__device__ __forceinline__ int32_t clamp_row(int32_t v, int32_t R) { return v < 0 ? 0 : (v > R ? R : v); }

// Expert e's rows [lo, hi), clamped into [0, R] and non-decreasing.
__device__ __forceinline__ void expert_rows(const int32_t* __restrict__ off, int e, int32_t R, int32_t& lo,
                                            int32_t& hi) {
  lo = clamp_row(off[e], R);
  hi = clamp_row(off[e + 1], R);
  if (hi < lo) hi = lo;
}

// Which (expert, row tile) block `tile` of the forward / dgrad grid computes. Returns false for blocks past the
// real tiles; then `pad_tile` is the index of the padding-row tile it zeroes (rows used + pad_tile * BM ...).
__device__ bool find_tile(const int32_t* __restrict__ off, int E, int32_t R, int64_t tile, int& expert,
                          int32_t& row0, int32_t& row_end, int32_t& used, int64_t& pad_tile) {
  int64_t cum = 0;
  bool found = false;
  for (int e = 0; e < E; ++e) {
    int32_t lo, hi;
    expert_rows(off, e, R, lo, hi);
    const int64_t tiles = (static_cast<int64_t>(hi - lo) + BM - 1) / BM;
    if (!found && tile < cum + tiles) {
      expert = e;
      row0 = lo + static_cast<int32_t>((tile - cum) * BM);
      row_end = hi;
      found = true;
    }
    cum += tiles;
  }
  used = E > 0 ? clamp_row(off[E], R) : 0;
  pad_tile = tile - cum;
  return found;
}

// acc += As(BM x BK) * Bs(BK x BN) for this warp's 32 x 32 quarter. ALayout / BLayout are wmma::row_major or
// wmma::col_major; lda / ldb are the shared tiles' leading dimensions.
template <typename ALayout, typename BLayout>
__device__ __forceinline__ void mma_chunk(const bf16* As, int lda, const bf16* Bs, int ldb,
                                          wmma::fragment<wmma::accumulator, 16, 16, 16, float> (&acc)[2][2],
                                          int warp_m, int warp_n) {
  constexpr bool a_row = std::is_same<ALayout, wmma::row_major>::value;  // As[m][k] else As[k][m]
  constexpr bool b_row = std::is_same<BLayout, wmma::row_major>::value;  // Bs[k][n] else Bs[n][k]
#pragma unroll
  for (int kk = 0; kk < BK; kk += 16) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, ALayout> fa[2];
    wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, BLayout> fb[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int m = warp_m * 32 + i * 16;
      wmma::load_matrix_sync(fa[i], a_row ? As + m * lda + kk : As + kk * lda + m, lda);
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int n = warp_n * 32 + j * 16;
      wmma::load_matrix_sync(fb[j], b_row ? Bs + kk * ldb + n : Bs + n * ldb + kk, ldb);
    }
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
  }
}

// Stores the block's accumulators into the shared fp32 tile c[BM][BN + kCPad] (followed by __syncthreads).
__device__ __forceinline__ void stage_acc(float* c, wmma::fragment<wmma::accumulator, 16, 16, 16, float> (&acc)[2][2],
                                          int warp_m, int warp_n) {
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j)
      wmma::store_matrix_sync(c + (warp_m * 32 + i * 16) * (BN + kCPad) + warp_n * 32 + j * 16, acc[i][j],
                              BN + kCPad, wmma::mem_row_major);
  __syncthreads();
}

// Zeroes rows [r0, r1) x columns [c0, min(c0 + BN, ncols)) of a row-major [*, ncols] bf16 matrix.
__device__ __forceinline__ void zero_rows(bf16* __restrict__ out, int64_t ncols, int32_t r0, int32_t r1, int64_t c0) {
  const int64_t width = (ncols - c0) < BN ? (ncols - c0) : BN;
  const int64_t n = static_cast<int64_t>(r1 - r0) * width;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) {
    const int64_t r = r0 + i / width, col = c0 + i % width;
    out[r * ncols + col] = __float2bfloat16(0.f);
  }
}

// Forward (TRANS_W = true): out[r, n] = sum_k in[r, k] W[e, n, k]   (in [R,K], W [E,N,K], out [R,N])
// Dgrad (TRANS_W = false):  out[r, n] = sum_k in[r, k] W[e, k, n]   (in [R,K], W [E,K,N], out [R,N])
template <bool TRANS_W>
__global__ void __launch_bounds__(kThreads) grouped_rows_kernel(const bf16* __restrict__ in,
                                                               const bf16* __restrict__ W,
                                                               const int32_t* __restrict__ off, int E, int32_t R,
                                                               int64_t N, int64_t K, bf16* __restrict__ out) {
  __shared__ Smem sm;
  const int64_t col0 = static_cast<int64_t>(blockIdx.y) * BN;
  int expert = 0;
  int32_t row0 = 0, row_end = 0, used = 0;
  int64_t pad_tile = 0;
  if (!find_tile(off, E, R, blockIdx.x, expert, row0, row_end, used, pad_tile)) {
    // A spare block: zero one tile of the padding rows [used, R), if any is left for it.
    const int64_t r0 = used + pad_tile * BM;
    if (r0 < R) zero_rows(out, N, static_cast<int32_t>(r0), static_cast<int32_t>(r0 + BM < R ? r0 + BM : R), col0);
    return;
  }
  const int32_t row_hi = row0 + BM < row_end ? row0 + BM : row_end;  // this tile's rows [row0, row_hi)
  const bf16* We = W + static_cast<int64_t>(expert) * N * K;

  const int warp = threadIdx.x / 32, warp_m = warp / 2, warp_n = warp % 2;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.f);

  constexpr int lda = BK + kPad;                     // A tile: [BM][BK + pad], m-major (row_major)
  constexpr int ldb = TRANS_W ? BK + kPad : BN + kPad;  // B tile: [BN][BK+pad] (col_major) or [BK][BN+pad]
  const bf16 zero = __float2bfloat16(0.f);
  for (int64_t k0 = 0; k0 < K; k0 += BK) {
    // A: rows of `in`, coalesced along k.
    for (int i = threadIdx.x; i < BM * BK; i += kThreads) {
      const int m = i / BK, k = i % BK;
      const int64_t r = row0 + m, kg = k0 + k;
      sm.a[m * lda + k] = (r < row_hi && kg < K) ? in[r * K + kg] : zero;
    }
    if (TRANS_W) {  // B(k, n) = W[e, n, k]: stored [n][k], coalesced along k
      for (int i = threadIdx.x; i < BN * BK; i += kThreads) {
        const int n = i / BK, k = i % BK;
        const int64_t ng = col0 + n, kg = k0 + k;
        sm.b[n * ldb + k] = (ng < N && kg < K) ? We[ng * K + kg] : zero;
      }
    } else {  // B(k, n) = W[e, k, n]: stored [k][n], coalesced along n
      for (int i = threadIdx.x; i < BK * BN; i += kThreads) {
        const int k = i / BN, n = i % BN;
        const int64_t ng = col0 + n, kg = k0 + k;
        sm.b[k * ldb + n] = (ng < N && kg < K) ? We[kg * N + ng] : zero;
      }
    }
    __syncthreads();
    if (TRANS_W)
      mma_chunk<wmma::row_major, wmma::col_major>(sm.a, lda, sm.b, ldb, acc, warp_m, warp_n);
    else
      mma_chunk<wmma::row_major, wmma::row_major>(sm.a, lda, sm.b, ldb, acc, warp_m, warp_n);
    __syncthreads();
  }

  stage_acc(sm.c, acc, warp_m, warp_n);
  for (int i = threadIdx.x; i < BM * BN; i += kThreads) {
    const int m = i / BN, n = i % BN;
    const int64_t r = row0 + m, ng = col0 + n;
    if (r < row_hi && ng < N) out[r * N + ng] = __float2bfloat16(sm.c[m * (BN + kCPad) + n]);
  }
}

// Wgrad: dW[e, m, n] += sum_{r in expert e} dy[r, m] x[r, n]   (dy [R,M], x [R,N], dW [E,M,N] F32)
// Grid (ceil(N/BN), ceil(M/BM), E).
__global__ void __launch_bounds__(kThreads) grouped_wgrad_kernel(const bf16* __restrict__ dy,
                                                                 const bf16* __restrict__ x,
                                                                 const int32_t* __restrict__ off, int32_t R,
                                                                 int64_t M, int64_t N, float* __restrict__ dW) {
  __shared__ Smem sm;
  const int e = blockIdx.z;
  int32_t lo, hi;
  expert_rows(off, e, R, lo, hi);
  if (hi <= lo) return;  // an expert with no rows leaves dW[e] unchanged
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * BM, n0 = static_cast<int64_t>(blockIdx.x) * BN;

  const int warp = threadIdx.x / 32, warp_m = warp / 2, warp_n = warp % 2;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.f);

  constexpr int lda = BM + kPad;  // A(m, k) = dy[k, m]: stored [k][m] (col_major)
  constexpr int ldb = BN + kPad;  // B(k, n) = x[k, n]:  stored [k][n] (row_major)
  const bf16 zero = __float2bfloat16(0.f);
  for (int32_t r0 = lo; r0 < hi; r0 += BK) {
    for (int i = threadIdx.x; i < BK * BM; i += kThreads) {
      const int k = i / BM, m = i % BM;
      const int64_t r = static_cast<int64_t>(r0) + k, mg = m0 + m;
      sm.a[k * lda + m] = (r < hi && mg < M) ? dy[r * M + mg] : zero;
    }
    for (int i = threadIdx.x; i < BK * BN; i += kThreads) {
      const int k = i / BN, n = i % BN;
      const int64_t r = static_cast<int64_t>(r0) + k, ng = n0 + n;
      sm.b[k * ldb + n] = (r < hi && ng < N) ? x[r * N + ng] : zero;
    }
    __syncthreads();
    mma_chunk<wmma::col_major, wmma::row_major>(sm.a, lda, sm.b, ldb, acc, warp_m, warp_n);
    __syncthreads();
  }

  stage_acc(sm.c, acc, warp_m, warp_n);
  float* dWe = dW + static_cast<int64_t>(e) * M * N;
  for (int i = threadIdx.x; i < BM * BN; i += kThreads) {
    const int m = i / BN, n = i % BN;
    const int64_t mg = m0 + m, ng = n0 + n;
    if (mg < M && ng < N) dWe[mg * N + ng] += sm.c[m * (BN + kCPad) + n];
  }
}

struct Groups {
  int64_t E, out, in;
};

// W / dW must be [E, out, in]; offsets [E+1] I32; rows is the row count of the row-grouped operands.
Groups check_groups(const Tensor& W, const Tensor& offsets, const char* op, const char* warg) {
  if (W.ndim != 3) cuda::fail(op, std::string(warg) + " must be [E, out, in], got " + W.shape_str());
  Groups g{W.shape[0], W.shape[1], W.shape[2]};
  cuda::expect_numel(offsets, g.E + 1, op, "offsets");
  (void)cuda::i32(offsets, op, "offsets");
  return g;
}

using cuda::expect_rows;

void check_limits(const char* op, int64_t R, int64_t E) {
  if (R > INT32_MAX) cuda::fail(op, "row count " + std::to_string(R) + " exceeds the I32 offsets' range");
  if (E > INT32_MAX - 1) cuda::fail(op, "too many experts: " + std::to_string(E));
}

// Shared launcher of forward / dgrad: out [R, N] from in [R, K] and the expert weights.
template <bool TRANS_W>
void launch_rows(const char* op, const bf16* in, const bf16* W, const int32_t* off, int64_t E, int64_t R,
                 int64_t N, int64_t K, bf16* out, cudaStream_t stream) {
  if (R == 0 || N == 0) return;
  const int64_t row_tiles = (R + BM - 1) / BM + E;  // >= real tiles + padding tiles (see find_tile)
  const int64_t col_tiles = (N + BN - 1) / BN;
  if (row_tiles > INT32_MAX || col_tiles > 65535)
    cuda::fail(op, "grid too large: " + std::to_string(row_tiles) + " x " + std::to_string(col_tiles) + " tiles");
  const dim3 grid(static_cast<unsigned>(row_tiles), static_cast<unsigned>(col_tiles));
  grouped_rows_kernel<TRANS_W><<<grid, kThreads, 0, stream>>>(in, W, off, static_cast<int>(E),
                                                               static_cast<int32_t>(R), N, K, out);
  cuda::check_launch(op);
}

}  // namespace

// Why ceil(R/BM) + E row tiles always cover the real tiles and the padding rows: with used = offsets[E] and
// counts n_e summing to used, sum_e ceil(n_e/BM) <= floor(used/BM) + E, and ceil(R/BM) - floor(used/BM) >=
// ceil((R - used)/BM), the number of padding tiles.

void CudaOps::grouped_gemm(const Tensor& x, const Tensor& W, const Tensor& offsets, const Tensor& y) {
  const char* op = "grouped_gemm";
  const int64_t R = x.ndim ? x.shape[0] : 0;
  const Groups g = check_groups(W, offsets, op, "W");
  check_limits(op, R, g.E);
  expect_rows(x, R, g.in, op, "x");
  expect_rows(y, R, g.out, op, "y");
  const bf16* xp = cuda::bf16p(x, op, "x");
  const bf16* wp = cuda::bf16p(W, op, "W");
  bf16* yp = cuda::bf16p(y, op, "y");
  const int32_t* off = cuda::i32(offsets, op, "offsets");
  if (sm90::try_grouped_fwd(xp, wp, off, g.E, R, g.out, g.in, yp, ctx())) return;  // Hopper TMA + wgmma
  sm90::note_grouped_impl("wmma");
  launch_rows<true>(op, xp, wp, off, g.E, R, g.out, g.in, yp, ctx().stream);
}

// On Hopper one kernel (the SwiGLU in the forward's epilogue); elsewhere the two ops.
void CudaOps::grouped_gemm_swiglu(const Tensor& x, const Tensor& W13, const Tensor& offsets, const Tensor& wp,
                                  const Tensor& h13, const Tensor& a) {
  const char* op = "grouped_gemm_swiglu";
  const int64_t R = x.ndim ? x.shape[0] : 0;
  const Groups g = check_groups(W13, offsets, op, "W13");
  check_limits(op, R, g.E);
  if (g.out % 2) cuda::fail(op, "W13 must hold 2f rows (gate and up) per expert, got " + W13.shape_str());
  const int64_t f = g.out / 2;
  expect_rows(x, R, g.in, op, "x");
  expect_rows(h13, R, g.out, op, "h13");
  expect_rows(a, R, f, op, "a");
  cuda::expect_numel(wp, R, op, "wp");
  const bf16* xp = cuda::bf16p(x, op, "x");
  const bf16* w13 = cuda::bf16p(W13, op, "W13");
  const float* w = cuda::f32(wp, op, "wp");
  bf16* hp = cuda::bf16p(h13, op, "h13");
  bf16* ap = cuda::bf16p(a, op, "a");
  const int32_t* off = cuda::i32(offsets, op, "offsets");
  if (sm90::try_grouped_fwd_swiglu(xp, w13, off, g.E, R, f, g.in, w, hp, ap, ctx())) return;
  grouped_gemm(x, W13, offsets, h13);
  swiglu_forward(h13, wp, a);
}

// On Hopper one kernel (the SwiGLU backward in the dgrad's epilogue, dwp's partials in dact's memory) and a small
// reduction; elsewhere the two ops.
void CudaOps::grouped_gemm_dgrad_swiglu(const Tensor& dy, const Tensor& W2, const Tensor& offsets, const Tensor& h13,
                                        const Tensor& wp, const Tensor& dact, const Tensor& dh13, const Tensor& dwp) {
  const char* op = "grouped_gemm_dgrad_swiglu";
  const int64_t R = dy.ndim ? dy.shape[0] : 0;
  const Groups g = check_groups(W2, offsets, op, "W2");
  check_limits(op, R, g.E);
  const int64_t f = g.in;
  expect_rows(dy, R, g.out, op, "dy");
  expect_rows(h13, R, 2 * f, op, "h13");
  expect_rows(dact, R, f, op, "dact");
  expect_rows(dh13, R, 2 * f, op, "dh13");
  cuda::expect_numel(wp, R, op, "wp");
  cuda::expect_numel(dwp, R, op, "dwp");
  const bf16* gp = cuda::bf16p(dy, op, "dy");
  const bf16* w2 = cuda::bf16p(W2, op, "W2");
  const bf16* hp = cuda::bf16p(h13, op, "h13");
  const float* w = cuda::f32(wp, op, "wp");
  bf16* scratch = cuda::bf16p(dact, op, "dact");
  bf16* dhp = cuda::bf16p(dh13, op, "dh13");
  float* dw = cuda::f32(dwp, op, "dwp");
  const int32_t* off = cuda::i32(offsets, op, "offsets");
  if (cuda::aligned16(scratch) &&
      sm90::try_grouped_dgrad_swiglu(gp, w2, off, g.E, R, g.out, f, hp, w, dhp, dw, reinterpret_cast<float*>(scratch),
                                     R * f / 2, ctx()))
    return;
  grouped_gemm_dgrad(dy, W2, offsets, dact);
  swiglu_backward(dact, h13, wp, dh13, dwp);
}

void CudaOps::grouped_gemm_dgrad(const Tensor& dy, const Tensor& W, const Tensor& offsets, const Tensor& dx) {
  const char* op = "grouped_gemm_dgrad";
  const int64_t R = dy.ndim ? dy.shape[0] : 0;
  const Groups g = check_groups(W, offsets, op, "W");
  check_limits(op, R, g.E);
  expect_rows(dy, R, g.out, op, "dy");
  expect_rows(dx, R, g.in, op, "dx");
  const bf16* gp = cuda::bf16p(dy, op, "dy");
  const bf16* wp = cuda::bf16p(W, op, "W");
  bf16* dxp = cuda::bf16p(dx, op, "dx");
  const int32_t* off = cuda::i32(offsets, op, "offsets");
  if (sm90::try_grouped_dgrad(gp, wp, off, g.E, R, g.out, g.in, dxp, ctx())) return;
  sm90::note_grouped_impl("wmma");
  launch_rows<false>(op, gp, wp, off, g.E, R, g.in, g.out, dxp, ctx().stream);
}

void CudaOps::grouped_gemm_wgrad(const Tensor& dy, const Tensor& x, const Tensor& offsets, const Tensor& dW) {
  const char* op = "grouped_gemm_wgrad";
  const int64_t R = dy.ndim ? dy.shape[0] : 0;
  const Groups g = check_groups(dW, offsets, op, "dW");
  check_limits(op, R, g.E);
  expect_rows(dy, R, g.out, op, "dy");
  expect_rows(x, R, g.in, op, "x");
  const bf16* gp = cuda::bf16p(dy, op, "dy");
  const bf16* xp = cuda::bf16p(x, op, "x");
  float* dwp = cuda::f32(dW, op, "dW");
  const int32_t* off = cuda::i32(offsets, op, "offsets");
  if (R == 0 || g.E == 0 || g.out == 0 || g.in == 0) return;
  const sm90::WgradRows set{gp, xp, off, R};
  if (sm90::try_grouped_wgrad(&set, 1, g.E, g.out, g.in, dwp, ctx())) return;
  sm90::note_grouped_impl("wmma");
  const int64_t n_tiles = (g.in + BN - 1) / BN, m_tiles = (g.out + BM - 1) / BM;
  if (n_tiles > INT32_MAX || m_tiles > 65535 || g.E > 65535)
    cuda::fail(op, "grid too large: " + std::to_string(n_tiles) + " x " + std::to_string(m_tiles) + " x " +
                       std::to_string(g.E));
  const dim3 grid(static_cast<unsigned>(n_tiles), static_cast<unsigned>(m_tiles), static_cast<unsigned>(g.E));
  grouped_wgrad_kernel<<<grid, kThreads, 0, ctx().stream>>>(gp, xp, off, static_cast<int32_t>(R), g.out, g.in,
                                                            dwp);
  cuda::check_launch(op);
}

namespace {
// The row sets with rows, checked against dW [E, out, in]; empty when there is nothing for the sm90 kernel.
struct WgradSetRows {
  std::vector<sm90::WgradRows> rows;
  int64_t E = 0, out = 0, in = 0;
  bool any() const { return !rows.empty() && E > 0 && out > 0 && in > 0; }
};
WgradSetRows wgrad_set_rows(const std::vector<Ops::WgradRowSet>& sets, const Tensor& dW, const char* op) {
  WgradSetRows w;
  for (const Ops::WgradRowSet& r : sets) {
    const int64_t R = r.dy.ndim ? r.dy.shape[0] : 0;
    const Groups g = check_groups(dW, r.offsets, op, "dW");
    check_limits(op, R, g.E);
    expect_rows(r.dy, R, g.out, op, "dy");
    expect_rows(r.x, R, g.in, op, "x");
    w.E = g.E, w.out = g.out, w.in = g.in;
    if (R > 0)
      w.rows.push_back(
          {cuda::bf16p(r.dy, op, "dy"), cuda::bf16p(r.x, op, "x"), cuda::i32(r.offsets, op, "offsets"), R});
  }
  return w;
}
}  // namespace

// A bf16 dW (expert_grad_dtype=bfloat16) where the Hopper kernel does not store it: expert by expert, the fp32
// sums of every set into a scratch of one expert's [out, in], rounded into dW[e] (the same single rounding), and
// with acc its squares. The sets' offsets slice to one expert's pair, which still indexes the set's rows.
void CudaOps::wgrad_sets_bf16_by_expert(const std::vector<WgradRowSet>& sets, const Tensor& dW, const Tensor* acc) {
  if (sets.empty()) return zero(dW);  // (no rows: zeros, whose squares add nothing)
  const Groups g = check_groups(dW, sets[0].offsets, "grouped_gemm_wgrad_sets", "dW");
  auto* tmp = static_cast<float*>(ctx_->scratch("wgrad_bf16", sizeof(float) * static_cast<size_t>(g.out * g.in)));
  const Tensor t(tmp, DType::F32, {1, g.out, g.in}, dW.device);
  for (int64_t e = 0; e < g.E; ++e) {
    std::vector<WgradRowSet> one;
    for (const WgradRowSet& r : sets) one.push_back({r.dy, r.x, r.offsets.rows(e, 2)});
    Ops::grouped_gemm_wgrad_sets(one, t, false);
    const Tensor de = dW.rows(e, 1);
    copy(t, de);
    if (acc) sum_squares(de, *acc);
  }
}

// One Hopper pass over every row set where the sm90 kernel applies; else (and for empty sets) one call per set.
void CudaOps::grouped_gemm_wgrad_sets(const std::vector<WgradRowSet>& sets, const Tensor& dW, bool accumulate) {
  const char* op = "grouped_gemm_wgrad_sets";
  const bool b16 = dW.dtype == DType::BF16;
  if (b16 && accumulate) cuda::fail(op, "a bf16 dW is stored, never added to (expert_grad_dtype=bfloat16)");
  const WgradSetRows w = wgrad_set_rows(sets, dW, op);
  if (w.any() && sm90::try_grouped_wgrad(w.rows.data(), static_cast<int>(w.rows.size()), w.E, w.out, w.in,
                                         b16 ? static_cast<void*>(cuda::bf16p(dW, op, "dW")) : cuda::f32(dW, op, "dW"),
                                         ctx(), accumulate, nullptr, 0, b16))
    return;
  if (b16) return wgrad_sets_bf16_by_expert(sets, dW, nullptr);
  Ops::grouped_gemm_wgrad_sets(sets, dW, accumulate);
}

// On Hopper the epilogue's per-warp sums of squares of the tiles it stores, summed in order into acc; elsewhere
// (or where the kernel does not apply) the store, then a pass over dW.
void CudaOps::grouped_gemm_wgrad_sets_norm(const std::vector<WgradRowSet>& sets, const Tensor& dW,
                                           const Tensor& acc) {
  const char* op = "grouped_gemm_wgrad_sets_norm";
  float* a = cuda::f32(acc, op, "acc");
  if (acc.numel() < 1) cuda::fail(op, "acc is empty");
  const bool b16 = dW.dtype == DType::BF16;
  const WgradSetRows w = wgrad_set_rows(sets, dW, op);
  if (w.any()) {
    const int64_t slots = sm90::wgrad_norm_slots(w.E, w.out, w.in);
    auto* part = static_cast<float*>(ctx_->scratch("wgrad_norm", sizeof(float) * static_cast<size_t>(slots)));
    if (sm90::try_grouped_wgrad(w.rows.data(), static_cast<int>(w.rows.size()), w.E, w.out, w.in,
                                b16 ? static_cast<void*>(cuda::bf16p(dW, op, "dW")) : cuda::f32(dW, op, "dW"),
                                ctx(), false, part, slots, b16)) {
      sum_values(part, slots, a, op);
      return;
    }
  }
  if (b16) return wgrad_sets_bf16_by_expert(sets, dW, &acc);
  Ops::grouped_gemm_wgrad_sets_norm(sets, dW, acc);
}

}  // namespace mxt
