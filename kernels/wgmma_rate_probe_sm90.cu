// The tensor pipe alone (wgmma_rate_probe.hpp): one CTA per SM, operands written once into shared memory in the
// layouts TMA's 128-byte swizzle gives the grouped GEMM, then each issuing warpgroup runs its wgmma chains over
// them k-block after k-block, committing and waiting as grouped_gemm_sm90.cu's consumers do.
#include <atomic>
#include <cstdio>

#include "sm90_host.cuh"
#include "sm90_ptx.cuh"
#include "sm90_wgmma.cuh"
#include "wgmma_rate_probe.hpp"

namespace mxt::sm90 {
namespace {

constexpr int kRows = 256, kK = 64;        // each operand: four 64-row blocks of one 64-deep k-block
constexpr int kBlock = 64 * kK * 2;        // bytes of one 64 x 64 bf16 block (8 KiB)
constexpr int kSmem = 2 * kRows * kK * 2 + 1024;

// Byte offset of element (row, k) of a 256 x 64 operand in its shared layout. K-major: 128-byte rows along k,
// 16-byte pieces XORed with row % 8. M/N-major: 64-row blocks of 8 KiB, each 64 k-rows of 64 elements along M/N,
// the pieces XORed with k % 8 (TMA's swizzle of a [k][64] box).
__host__ __device__ inline uint32_t operand_offset(int trans, int row, int k) {
  if (trans == 0) return static_cast<uint32_t>(row * 128 + ((((k >> 3) ^ row) & 7) << 4) + (k & 7) * 2);
  const int mm = row & 63;
  return static_cast<uint32_t>((row >> 6) * kBlock + k * 128 + ((((mm >> 3) ^ k) & 7) << 4) + (mm & 7) * 2);
}

template <int kN, int kT>
__device__ __forceinline__ void wgmma_n(float (&d)[kN / 2], uint64_t da, uint64_t db) {
  if constexpr (kN == 256)
    wgmma_m64n256k16<kT, kT>(d, da, db, 1u);
  else if constexpr (kN == 128)
    wgmma_m64n128k16<kT, kT>(d, da, db, 1u);
  else
    wgmma_m64n64k16<kT, kT>(d, da, db, 1u);
}

template <int kWG, int kChains, int kN, int kT, int kPend>
__global__ void __launch_bounds__(256, 1)
    rate_kernel(const uint16_t* __restrict__ a, const uint16_t* __restrict__ b, float* out, int kblocks,
                unsigned long long* cycles) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(kChains * kN / 2 <= 128, "accumulators must fit the register budget");
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  uint8_t* base = smem_raw + ((1024u - (raw & 1023u)) & 1023u);
  const int tid = static_cast<int>(threadIdx.x);
  for (int i = tid; i < kRows * kK; i += blockDim.x) {
    const int r = i / kK, k = i % kK;
    *reinterpret_cast<uint16_t*>(base + operand_offset(kT, r, k)) = a[i];
    *reinterpret_cast<uint16_t*>(base + kRows * kK * 2 + operand_offset(kT, r, k)) = b[i];
  }
  fence_proxy_async_smem();  // the generic stores, before wgmma reads them through the async proxy
  __syncthreads();

  const int wg = tid / 128;
  const uint32_t sa = smem_u32(base), sb = sa + kRows * kK * 2;
  float acc[kChains][kN / 2];
#pragma unroll
  for (int c = 0; c < kChains; ++c)
#pragma unroll
    for (int i = 0; i < kN / 2; ++i) acc[c][i] = 0.f;
  const long long t0 = clock64();
  for (int kb = 0; kb < kblocks; ++kb) {
    wgmma_fence();
#pragma unroll
    for (int s = 0; s < kK / 16; ++s) {
      // As mma_kblock: K-major steps 32 bytes along the rows, M/N-major 16 k-rows of 128 bytes.
      const uint64_t db = kT ? smem_desc(sb + s * 2048, kBlock, 1024) : smem_desc(sb + s * 32, 16, 1024);
#pragma unroll
      for (int c = 0; c < kChains; ++c) {
        const uint32_t blk = sa + static_cast<uint32_t>(((wg * kChains + c) & 3) * kBlock);
        const uint64_t da = kT ? smem_desc(blk + s * 2048, kBlock, 1024) : smem_desc(blk + s * 32, 16, 1024);
        wgmma_n<kN, kT>(acc[c], da, db);
      }
    }
    wgmma_commit();
    wgmma_wait<kPend>();
  }
  wgmma_wait<0>();
#pragma unroll
  for (int c = 0; c < kChains; ++c)
#pragma unroll
    for (int i = 0; i < kN / 2; ++i) fence_operand(acc[c][i]);
  const long long t1 = clock64();
  if ((tid & 127) == 0) atomicAdd(cycles, static_cast<unsigned long long>(t1 - t0));
  if (blockIdx.x == 0 && out != nullptr) {
    // Accumulator j of thread t (sm90_wgmma.cuh): row 16 warp + lane / 4 (+ 8 for the odd pair), column
    // 8 (j / 4) + 2 (lane % 4) + j % 2.
    const int t = tid & 127, w = t / 32, l = t % 32;
#pragma unroll
    for (int c = 0; c < kChains; ++c) {
      float* o = out + (static_cast<size_t>(wg) * kChains + c) * 64 * kN;
#pragma unroll
      for (int j = 0; j < kN / 2; ++j) {
        const int row = 16 * w + l / 4 + ((j >> 1) & 1) * 8, col = 8 * (j / 4) + 2 * (l % 4) + (j & 1);
        o[row * kN + col] = acc[c][j];
      }
    }
  }
#else
  (void)a, (void)b, (void)out, (void)kblocks, (void)cycles;
#endif
}

using RateFn = void (*)(const uint16_t*, const uint16_t*, float*, int, unsigned long long*);

// A pattern and its kernel, both from one list of template arguments.
struct Entry {
  RatePattern p;
  RateFn fn;
};

template <int kWG, int kChains, int kN, int kT, int kPend>
Entry entry(const char* name) {
  return {{name, kWG, kChains, kN, kT, kPend}, rate_kernel<kWG, kChains, kN, kT, kPend>};
}

const Entry kEntries[] = {
    entry<2, 1, 256, 0, 1>("2 wg x 1 chain m64n256 (the grouped GEMM's)"),
    entry<1, 1, 256, 0, 1>("1 wg x 1 chain m64n256"),
    entry<1, 1, 256, 0, 0>("1 wg x 1 chain m64n256, wait 0"),
    entry<2, 1, 128, 0, 1>("2 wg x 1 chain m64n128"),
    entry<1, 2, 128, 0, 1>("1 wg x 2 chains m64n128"),
    entry<2, 2, 128, 0, 1>("2 wg x 2 chains m64n128"),
    entry<1, 1, 128, 0, 1>("1 wg x 1 chain m64n128"),
    entry<1, 4, 64, 0, 1>("1 wg x 4 chains m64n64"),
    entry<2, 1, 256, 1, 1>("2 wg x 1 chain m64n256, M/N-major (wgrad's)"),
    entry<1, 1, 256, 1, 1>("1 wg x 1 chain m64n256, M/N-major"),
    entry<1, 2, 128, 1, 1>("1 wg x 2 chains m64n128, M/N-major"),
};
constexpr int kPatternCount = sizeof(kEntries) / sizeof(kEntries[0]);

std::atomic<int> g_sm90_cache[64];

bool fail(const char* why) {
  std::fprintf(stderr, "wgmma_rate_probe: %s\n", why);
  return false;
}

}  // namespace

int rate_pattern_count() { return kPatternCount; }
const RatePattern& rate_pattern(int i) { return kEntries[i < 0 || i >= kPatternCount ? 0 : i].p; }

bool wgmma_rate_probe(const RateConfig& cfg, const uint16_t* a, const uint16_t* b, float* out, RateResult* res,
                      cudaStream_t stream) {
  if (cfg.pattern < 0 || cfg.pattern >= kPatternCount) return fail("no such pattern");
  if (cfg.kblocks < 1) return fail("kblocks must be at least 1");
  if (a == nullptr || b == nullptr) return fail("a and b must be device buffers of 256 x 64 bf16");
  const RateFn fn = kEntries[cfg.pattern].fn;
  const RatePattern& p = kEntries[cfg.pattern].p;
  int sms = 0;
  if (const char* why = probe_launch_check(reinterpret_cast<const void*>(fn), g_sm90_cache, cfg.ctas, sms))
    return fail(why);
  if (cudaFuncSetAttribute(reinterpret_cast<const void*>(fn), cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem) !=
      cudaSuccess)
    return fail("cannot reserve shared memory");
  static unsigned long long* counter = nullptr;
  if (counter == nullptr && cudaMalloc(&counter, sizeof(unsigned long long)) != cudaSuccess)
    return fail("cannot allocate the cycle counter");
  cudaEvent_t ev[2];
  if (cudaEventCreate(&ev[0]) != cudaSuccess || cudaEventCreate(&ev[1]) != cudaSuccess)
    return fail("cannot create events");
  const int grid = cfg.ctas > 0 ? cfg.ctas : sms;
  cudaMemsetAsync(counter, 0, sizeof(unsigned long long), stream);
  cudaEventRecord(ev[0], stream);
  fn<<<grid, 128 * p.warpgroups, kSmem, stream>>>(a, b, out, cfg.kblocks, counter);
  cudaEventRecord(ev[1], stream);
  const cudaError_t launched = cudaGetLastError();
  unsigned long long cyc = 0;
  float ms = 0.f;
  const bool ok = launched == cudaSuccess &&
                  cudaMemcpyAsync(&cyc, counter, sizeof(cyc), cudaMemcpyDeviceToHost, stream) == cudaSuccess &&
                  cudaStreamSynchronize(stream) == cudaSuccess && cudaEventElapsedTime(&ms, ev[0], ev[1]) == cudaSuccess;
  cudaEventDestroy(ev[0]);
  cudaEventDestroy(ev[1]);
  if (!ok) return fail(launched != cudaSuccess ? cudaGetErrorString(launched) : "the launch failed");
  if (res != nullptr) {
    res->cycles_per_kblock = static_cast<double>(cyc) / (static_cast<double>(grid) * p.warpgroups * cfg.kblocks);
    const double flop_kblock = 2.0 * 64 * p.n * kK * p.chains * p.warpgroups;
    res->flop_per_cycle = flop_kblock / res->cycles_per_kblock;
    res->ms = ms;
    res->tflops = flop_kblock * cfg.kblocks * grid / (ms * 1e-3) / 1e12;
  }
  return true;
}

}  // namespace mxt::sm90
