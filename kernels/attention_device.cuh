#pragma once
// Device building blocks of the attention kernels: tensor-core mma.sync m16n8k16 (bf16 in, fp32 accumulate),
// ldmatrix fragment loads, cp.async copies, swizzled shared-memory tiles, fast exp2, bf16 packing.
//
// Every instruction the kernels issue that touches another thread's data or shared memory goes through a
// helper here, so that the kernels can also be compiled for the host by a warp emulator (MXT_ATTN_EMU: a
// development tool that runs each CUDA thread as a host thread, checks shared-memory races and cp.async
// completion, and compares with the CPU twin). Kernel code stays plain C++ besides these helpers.
//
// Fragment layouts of mma.sync.m16n8k16 (lane = 4 * g + c, g = lane / 4, c = lane % 4):
//   A (16x16, row-major):  a0 = A[g][2c..2c+1]   a1 = A[g+8][2c..2c+1]   a2 = A[g][2c+8..+9]   a3 = A[g+8][2c+8..+9]
//   B (16x8, k x n):       b0 = B[2c..2c+1][g]   b1 = B[2c+8..2c+9][g]
//   C (16x8 fp32):         c0,c1 = C[g][2c..2c+1]                          c2,c3 = C[g+8][2c..2c+1]
// Each 32-bit register holds two bf16, the lower column / k index in the low half. The accumulators of two
// adjacent n8 tiles (16 columns) are exactly the A fragment of those 16 columns, so a softmax computed in
// registers feeds the next product without going through shared memory.
//
// ldmatrix.x4 with lane l addressing row (r0 + (l & 15)), column (c0 + (l >> 4) * 8) of a 16x16 block loads
// four 8x8 matrices: m0 = rows r0..+7 / cols c0..+7, m1 = rows r0+8..+15 / cols c0..+7, m2 = rows r0..+7 /
// cols c0+8..+15, m3 = rows r0+8..+15 / cols c0+8..+15. Lane l receives from each matrix M the pair
// M[g][2c..2c+1] (plain) or M[2c..2c+1][g] (.trans). So, for the block at (r0, c0):
//   A operand, tile stored [m][k]:          a = {m0, m1, m2, m3}
//   B operand, tile stored [n][k] (K^T):    n8 tile n0: {m0, m2}    n8 tile n0+8: {m1, m3}     (plain)
//   B operand, tile stored [k][n] (V):      n8 tile n0: {m0, m1}    n8 tile n0+8: {m2, m3}     (.trans)
#include <cstdint>

#ifndef MXT_ATTN_EMU
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#endif

namespace mxt::cuda::attn {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Element offset of (row r, column c) in a shared-memory tile of rows of D bf16 (D a multiple of 64), with
// the 16-byte chunks of each row XOR-swizzled by (r % 8): the 8 rows an ldmatrix phase reads at one logical
// column then sit in 8 different bank groups (no conflicts), and so do the 16-byte cp.async writes.
template <int D>
__device__ __forceinline__ int swz(int r, int c) {
  static_assert(D % 64 == 0, "swizzled tiles need rows of at least 8 chunks of 16 bytes");
  return r * D + ((((c >> 3) ^ r) & 7) | ((c >> 3) & ~7)) * 8 + (c & 7);
}

// ldmatrix row addresses in a swizzled tile: lane l addresses row r0 + (l & 15), column c0 + (l >> 4) * 8, for
// r0 a multiple of 8 and c0 a multiple of 16 (compile-time after unrolling). Then (row % 8) = (l % 8), and the
// swizzled chunk is ((2 * (c0 / 16) % 8) ^ x) + 8 * (c0 / 64) with x = (l >> 4) ^ (l & 7): four per-lane
// offsets (one per c0 / 16 mod 4) plus immediates, instead of one live address register per (row, column) pair.
template <int D>
struct LdsmOff {
  int off[4];
  __device__ __forceinline__ explicit LdsmOff(int lane) {
    const int x = (lane >> 4) ^ (lane & 7);
#pragma unroll
    for (int i = 0; i < 4; ++i) off[i] = (lane & 15) * D + 8 * ((2 * i) ^ x);
  }
  __device__ __forceinline__ int operator()(int r0, int c0) const { return off[(c0 >> 4) & 3] + r0 * D + (c0 >> 6) * 64; }
};

#ifndef MXT_ATTN_EMU

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ldmatrix.x4 (see the header comment); p is this lane's row address in shared memory (16-byte aligned).
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const uint16_t* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const uint16_t* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// 16-byte asynchronous global -> shared copy; writes zeros instead when !valid (src is then not read).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
// 4-byte variant (row statistics, document ids).
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// 2^x (ex2.approx, flushes denormals; 2^-inf = +0).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Two floats -> bf16x2 (lo in the low half), round to nearest even.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
__device__ __forceinline__ float bf16_lo(uint32_t v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t v) { return __uint_as_float(v & 0xffff0000u); }

// Plain shared-memory accesses of small values (the emulator checks them for races).
template <typename T>
__device__ __forceinline__ T lds(const T* p) {
  return *p;
}
template <typename T>
__device__ __forceinline__ void sts(T* p, T v) {
  *p = v;
}

// Scalar global loads and stores (the emulator checks their bounds).
template <typename T>
__device__ __forceinline__ T ldg(const T* p) {
  return *p;
}
template <typename T>
__device__ __forceinline__ void stg(T* p, T v) {
  *p = v;
}

#define MXT_ATTN_DYN_SMEM(name) \
  extern __shared__ __align__(128) unsigned char mxt_attn_smem_raw[]; \
  unsigned char* name = mxt_attn_smem_raw

#endif  // !MXT_ATTN_EMU

// Issues cp.async copies of rows [r0, r0 + ROWS) of D bf16 (global row r at src + r * stride) into a
// swizzled tile; rows at or past S are zero-filled, so masked products never meet garbage or NaN.
// All NT threads of the block take part; the caller commits the group.
template <int D, int ROWS, int NT>
__device__ __forceinline__ void load_tile_async(uint16_t* dst, const uint16_t* src, int64_t stride, int r0, int S,
                                                int tid) {
  constexpr int CH = D / 8;      // 16-byte chunks per row
  constexpr int RPI = NT / CH;   // rows per iteration; a multiple of 8 keeps this thread's swizzle fixed
  static_assert(NT % CH == 0 && RPI % 8 == 0 && ROWS % RPI == 0, "tile rows must split evenly over the block");
  const int r = tid / CH, ch = tid % CH;
  uint16_t* d = dst + swz<D>(r, ch * 8);
#pragma unroll
  for (int it = 0; it < ROWS / RPI; ++it) {
    const int row = r0 + r + it * RPI;
    const bool ok = row < S;
    cp_async16(d + it * RPI * D, src + static_cast<int64_t>(ok ? row : 0) * stride + ch * 8, ok);
  }
}

// Writes a tile staged in shared memory (swizzled, rows of D bf16) to global rows [r0, min(r0 + ROWS, S))
// with 16-byte coalesced stores. The caller synchronises before (staging complete).
template <int D, int ROWS, int NT>
__device__ __forceinline__ void store_tile(uint16_t* dst, int64_t stride, const uint16_t* src, int r0, int S,
                                          int tid) {
  constexpr int CH = D / 8;
  constexpr int RPI = NT / CH;
  static_assert(NT % CH == 0 && RPI % 8 == 0 && ROWS % RPI == 0, "tile rows must split evenly over the block");
  const int r = tid / CH, ch = tid % CH;
  const uint16_t* s = src + swz<D>(r, ch * 8);
#pragma unroll
  for (int it = 0; it < ROWS / RPI; ++it) {
    const int row = r0 + r + it * RPI;
    if (row < S)
      stg(reinterpret_cast<uint4*>(dst + static_cast<int64_t>(row) * stride + ch * 8),
          lds(reinterpret_cast<const uint4*>(s + it * RPI * D)));
  }
}

// Block-wide maximum of one int per thread (NT threads, red: NT / 32 ints of shared scratch). Every thread
// gets the result; red may be reused once this returns.
template <int NT>
__device__ __forceinline__ int block_max(int v, int* red) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  if (threadIdx.x % 32 == 0) sts(&red[threadIdx.x / 32], v);
  __syncthreads();
  int r = lds(&red[0]);
#pragma unroll
  for (int w = 1; w < NT / 32; ++w) r = max(r, lds(&red[w]));
  __syncthreads();
  return r;
}

// Packed rows: document runs. doc points at one batch row's ids. The run of t is the longest stretch of equal
// ids around t; the kernels only skip tiles outside it, so documents must be contiguous runs (as packing
// makes them); the element mask itself compares ids. Scans NT ids per step, cooperatively.
template <int NT>
__device__ __forceinline__ int block_run_start(const int32_t* doc, int t, int* red) {
  const int32_t d = ldg(doc + t);
  for (int hi = t - 1; hi >= 0; hi -= NT) {
    const int i = hi - static_cast<int>(threadIdx.x);
    const int differ = block_max<NT>(i >= 0 && ldg(doc + i) != d ? i : -1, red);
    if (differ >= 0) return differ + 1;
  }
  return 0;
}
// The last index of t's run (< S).
template <int NT>
__device__ __forceinline__ int block_run_end(const int32_t* doc, int t, int S, int* red) {
  const int32_t d = ldg(doc + t);
  for (int lo = t + 1; lo < S; lo += NT) {
    const int i = lo + static_cast<int>(threadIdx.x);
    const int differ = -block_max<NT>(i < S && ldg(doc + i) != d ? -i : -S - 1, red);
    if (differ <= S) return differ - 1;
  }
  return S - 1;
}

}  // namespace mxt::cuda::attn
