// The weight gradient's epilogue alone (wgrad_epilogue_probe.hpp): two warpgroups per CTA, one CTA per SM, each
// tile's fp32 values leaving the wgmma accumulator fragments as grouped_gemm_sm90.cu's wgrad epilogue does.
#include <cuda.h>
#include <cudaTypedefs.h>

#include <atomic>
#include <cstdio>

#include "sm90_host.cuh"
#include "sm90_ptx.cuh"
#include "wgrad_epilogue_probe.hpp"

namespace mxt::sm90 {
namespace {

constexpr int kTileM = 128, kTileN = 256, kAcc = kTileN / 2;  // a consumer thread's m64n256 fragment

constexpr int kLoadKb = 6 * 64 * 64 * 2;  // one stand-in k-block: six 64 x 64 bf16 boxes (a 128 x 256 item's)
constexpr int kLoadStages = 2;

struct ProbeArgs {
  float* out;
  int E, M, N;
  long long delay;
  int stagger, prefetch;
  unsigned long long* cycles;  // [epilogue cycles, warpgroup epilogues]
  long long load_kb;           // the load stream's pace in cycles per k-block (< 0: none)
  int load_rows;
  uint32_t load_off;           // shared offsets of the load ring (after the boxes) and of its 2 mbarriers and the
  uint32_t bar_off;            // stop flag (after the ring, or the boxes without a stream)
};

__device__ __forceinline__ void spin(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

// Byte offset of fp32 (row, col) in a box of kCols columns: 64-byte rows under the 64-byte swizzle, or 128-byte
// rows under the 128-byte one.
template <int kCols>
__device__ __forceinline__ uint32_t box_offset(int row, int col) {
  return kCols == 16 ? sw64_offset(row, col) : sw128_offset(row, col);
}

// red.global.add.v4.f32 of four adjacent columns per lane from a lane pair's m64n256 fragments (a0, a1: row ra at
// pa; a2, a3: row rb at pb): the even lane sends a2, a3 and adds row ra's four columns, the odd lane sends a0, a1
// and adds row rb's (pb_odd = its pb - 2). One volatile block, so the compiler keeps each pair's selects, shuffles
// and red together instead of hoisting a tile's worth ahead and spilling.
__device__ __forceinline__ void red_v4_pair(uint32_t odd, float* pa, float* pb_odd, float a0, float a1, float a2,
                                            float a3) {
  asm volatile(
      "{\n .reg .pred p;\n .reg .f32 s0, s1, g0, g1, x0, x1, x2, x3;\n .reg .b64 ad;\n"
      " setp.ne.u32 p, %0, 0;\n selp.f32 s0, %3, %5, p;\n selp.f32 s1, %4, %6, p;\n"
      " shfl.sync.bfly.b32 g0, s0, 1, 0x1f, 0xffffffff;\n shfl.sync.bfly.b32 g1, s1, 1, 0x1f, 0xffffffff;\n"
      " selp.f32 x0, g0, %3, p;\n selp.f32 x1, g1, %4, p;\n selp.f32 x2, %5, g0, p;\n selp.f32 x3, %6, g1, p;\n"
      " selp.b64 ad, %2, %1, p;\n red.global.add.v4.f32 [ad], {x0, x1, x2, x3};\n}" ::"r"(odd),
      "l"(pa), "l"(pb_odd), "f"(a0), "f"(a1), "f"(a2), "f"(a3)
      : "memory");
}

// The ninth warp's load stream (one thread): k-block after k-block into the 2-stage ring until the consumers
// raise the stop flag, each stage reused once its previous k-block has landed.
__device__ __forceinline__ void load_stream(const CUtensorMap* ml, const ProbeArgs& a, uint32_t ring,
                                            uint64_t* full, volatile int* stop) {
  const long long t0 = clock64();
  long long kb = 0;
  for (; !*stop; ++kb) {
    const int st = static_cast<int>(kb % kLoadStages);
    if (kb >= kLoadStages) mbar_wait(&full[st], static_cast<uint32_t>((kb / kLoadStages - 1) & 1));
    if (a.load_kb > 0)
      while (clock64() - t0 < kb * a.load_kb) {
      }
    mbar_arrive_expect_tx(&full[st], kLoadKb);
#pragma unroll
    for (int i = 0; i < 6; ++i) {
      const long long box = (kb * 6 + i) + 7919LL * blockIdx.x;
      const int col = static_cast<int>(box % 64) * 64, row = static_cast<int>((box / 64) * 64 % a.load_rows);
      tma_load_2d(ring + st * kLoadKb + i * 8192, ml, smem_u32(&full[st]), col, row);
    }
  }
  for (long long k = kb > kLoadStages ? kb - kLoadStages : 0; k < kb; ++k)  // the ring stays until it has landed
    mbar_wait(&full[k % kLoadStages], static_cast<uint32_t>((k / kLoadStages) & 1));
}

// kWrite: a ProbeWrite's value; warps 0-7 are the two consumer warpgroups, warp 8 the load stream.
template <int kWrite, int kCols, int kBufs>
__global__ void __launch_bounds__(288, 1)
    probe_kernel(const __grid_constant__ CUtensorMap mc, const __grid_constant__ CUtensorMap pf,
                 const __grid_constant__ CUtensorMap ml, ProbeArgs a) {
  constexpr int kBox = 64 * kCols * 4;
  constexpr bool kTma = kWrite == 0 || kWrite == 1 || kWrite == 5;
  constexpr int kWarpBox = 16 * kCols * 4;  // kWrite 6: one warp's 16 rows
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t smem = (smem_u32(smem_raw) + 1023u) & ~1023u;
  uint8_t* smem_gen = smem_raw + (smem - smem_u32(smem_raw));
  uint64_t* full = reinterpret_cast<uint64_t*>(smem_gen + a.bar_off);
  volatile int* stop = reinterpret_cast<volatile int*>(full + kLoadStages);
  if (threadIdx.x == 256) {
    for (int i = 0; i < kLoadStages; ++i) mbar_init(&full[i], 1);
    *stop = 0;
    fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x >= 256) {
    if (threadIdx.x == 256 && a.load_kb >= 0) load_stream(&ml, a, smem + a.load_off, full, stop);
    return;
  }
  const int ct = threadIdx.x, cw = ct / 128, wt = ct % 128, warp = wt / 32, lane = ct % 32;
  const int col_l = 2 * (lane % 4), r0 = warp * 16 + lane / 4;  // the fragment's rows r0, r0 + 8 of 64
  const uint32_t boxes = smem + cw * kBufs * kBox, warp_boxes = smem + (ct / 32) * kBufs * kWarpBox;
  const int m_tiles = a.M / kTileM, n_tiles = a.N / kTileN, total = a.E * m_tiles * n_tiles;
  unsigned long long my_cycles = 0, my_epis = 0;
  int epi_box = 0;
  if (a.stagger) spin((blockIdx.x % 8) * a.delay / 8);
  for (int item = blockIdx.x; item < total; item += gridDim.x) {
    const int mt = item % m_tiles, rest = item / m_tiles, nt = rest % n_tiles, e = rest / n_tiles;
    const int m0 = mt * kTileM, n0 = nt * kTileN;
    constexpr bool kAdds = kWrite == 0 || kWrite == 2 || kWrite == 4 || kWrite == 6;
    if (kAdds && a.prefetch && ct == 0) tma_prefetch_l2_3d(&pf, n0, m0, e);
    spin(a.delay);
    float acc[kAcc];
    const int64_t ra = m0 + cw * 64 + r0, rb = ra + 8;
#pragma unroll
    for (int j = 0; j < kAcc / 4; ++j) {
      const int64_t n = n0 + 8 * j + col_l;
      acc[4 * j] = probe_value(e, ra, n);
      acc[4 * j + 1] = probe_value(e, ra, n + 1);
      acc[4 * j + 2] = probe_value(e, rb, n);
      acc[4 * j + 3] = probe_value(e, rb, n + 1);
    }
#pragma unroll
    for (int i = 0; i < kAcc; ++i) asm volatile("" : "+f"(acc[i]));  // values ready before the clock starts
    const long long t0 = clock64();
    if constexpr (kTma) {
#pragma unroll
      for (int c = 0; c < kTileN / kCols; ++c) {
        const int b = epi_box;
        epi_box = epi_box + 1 == kBufs ? 0 : epi_box + 1;
        if (wt == 0) bulk_wait_group_read<kBufs - 1>();
        named_barrier_sync(2 + cw, 128);
        const uint32_t box = boxes + b * kBox;
#pragma unroll
        for (int jj = 0; jj < kCols / 8; ++jj) {
          const int q = 4 * (c * (kCols / 8) + jj), col = 8 * jj + col_l;
          st_shared_f32x2(box + box_offset<kCols>(r0, col), acc[q], acc[q + 1]);
          st_shared_f32x2(box + box_offset<kCols>(r0 + 8, col), acc[q + 2], acc[q + 3]);
        }
        fence_proxy_async_smem();
        named_barrier_sync(2 + cw, 128);
        if (wt == 0 && kWrite != 5) {
          if (kWrite == 0)
            tma_reduce_add_3d(&mc, box, n0 + kCols * c, m0 + 64 * cw, e);
          else
            tma_store_3d(&mc, box, n0 + kCols * c, m0 + 64 * cw, e);
          bulk_commit_group();
        }
      }
    } else if constexpr (kWrite == 6) {
#pragma unroll
      for (int c = 0; c < kTileN / kCols; ++c) {
        const int b = epi_box;
        epi_box = epi_box + 1 == kBufs ? 0 : epi_box + 1;
        if (lane == 0) bulk_wait_group_read<kBufs - 1>();
        __syncwarp();
        const uint32_t box = warp_boxes + b * kWarpBox;
#pragma unroll
        for (int jj = 0; jj < kCols / 8; ++jj) {
          const int q = 4 * (c * (kCols / 8) + jj), col = 8 * jj + col_l;
          st_shared_f32x2(box + box_offset<kCols>(lane / 4, col), acc[q], acc[q + 1]);
          st_shared_f32x2(box + box_offset<kCols>(lane / 4 + 8, col), acc[q + 2], acc[q + 3]);
        }
        fence_proxy_async_smem();
        __syncwarp();
        if (lane == 0) {
          tma_reduce_add_3d(&mc, box, n0 + kCols * c, m0 + 64 * cw + 16 * warp, e);
          bulk_commit_group();
        }
      }
    } else {
      // Two row pointers stepped through an opaque copy, so the compiler cannot compute all 64 addresses ahead of
      // the first red and run out of registers.
      float* pa = a.out + (static_cast<int64_t>(e) * a.M + ra) * a.N + n0 + col_l;
      float* pb = pa + 8 * static_cast<int64_t>(a.N);
      const uint32_t odd = lane & 1;
#pragma unroll
      for (int j = 0; j < kAcc / 4; ++j) {
        if constexpr (kWrite == 2) {
          red_add_f32x2(pa, acc[4 * j], acc[4 * j + 1]);
          red_add_f32x2(pb, acc[4 * j + 2], acc[4 * j + 3]);
        } else if constexpr (kWrite == 3) {
          *reinterpret_cast<float2*>(pa) = make_float2(acc[4 * j], acc[4 * j + 1]);
          *reinterpret_cast<float2*>(pb) = make_float2(acc[4 * j + 2], acc[4 * j + 3]);
        } else {
          red_v4_pair(odd, pa, pb - 2, acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]);
        }
        pa += 8;
        pb += 8;
        asm volatile("" : "+l"(pa), "+l"(pb));
      }
    }
    if constexpr (kWrite == 6) named_barrier_sync(2 + cw, 128);  // the warpgroup's epilogue ends with its last warp
    my_cycles += static_cast<unsigned long long>(clock64() - t0);
    ++my_epis;
  }
  if constexpr (kTma) {
    if (wt == 0) bulk_wait_group<0>();  // the boxes stay allocated until the TMA is done with them
  } else if constexpr (kWrite == 6) {
    if (lane == 0) bulk_wait_group<0>();
  }
  if (ct == 0) *stop = 1;  // (warpgroup 1 may still be at its last tile: the stream runs a little less long)
  if (wt == 0) {
    atomicAdd(a.cycles, my_cycles);
    atomicAdd(a.cycles + 1, my_epis);
  }
}

using ProbeFn = void (*)(CUtensorMap, CUtensorMap, CUtensorMap, ProbeArgs);

template <int kWrite, int kCols>
ProbeFn pick_bufs(int bufs) {
  switch (bufs) {
    case 1: return probe_kernel<kWrite, kCols, 1>;
    case 2: return probe_kernel<kWrite, kCols, 2>;
    case 3: return probe_kernel<kWrite, kCols, 3>;
    case 6: return probe_kernel<kWrite, kCols, 6>;
    case 12: return probe_kernel<kWrite, kCols, 12>;
    default: return nullptr;
  }
}

template <int kWrite>
ProbeFn pick_cols(int cols, int bufs) {
  return cols == 16 ? pick_bufs<kWrite, 16>(bufs) : cols == 32 ? pick_bufs<kWrite, 32>(bufs) : nullptr;
}

std::atomic<int> g_sm90_cache[64];

bool fail(const char* why) {
  std::fprintf(stderr, "wgrad_epilogue_probe: %s\n", why);
  return false;
}

}  // namespace

bool wgrad_epilogue_probe(const ProbeConfig& cfg, float* dW, int E, int M, int N, ProbeCycles* cycles,
                          cudaStream_t stream) {
  if (E < 1 || M < kTileM || N < kTileN || M % kTileM != 0 || N % kTileN != 0)
    return fail("dW must be [E >= 1, M, N] with M a multiple of 128 and N of 256");
  ProbeFn fn = nullptr;
  switch (cfg.write) {
    case ProbeWrite::kTmaAdd: fn = pick_cols<0>(cfg.box_cols, cfg.bufs); break;
    case ProbeWrite::kTmaStore: fn = pick_cols<1>(cfg.box_cols, cfg.bufs); break;
    case ProbeWrite::kSmemOnly: fn = pick_cols<5>(cfg.box_cols, cfg.bufs); break;
    case ProbeWrite::kTmaAddWarp: fn = pick_cols<6>(cfg.box_cols, cfg.bufs); break;
    case ProbeWrite::kRedV2: fn = probe_kernel<2, 16, 2>; break;
    case ProbeWrite::kStV2: fn = probe_kernel<3, 16, 2>; break;
    case ProbeWrite::kRedV4: fn = probe_kernel<4, 16, 2>; break;
  }
  if (fn == nullptr) return fail("box_cols must be 16 or 32 and bufs 1, 2, 3, 6 or 12");
  int sms = 0;
  if (const char* why = probe_launch_check(reinterpret_cast<const void*>(fn), g_sm90_cache, cfg.ctas, sms))
    return fail(why);

  // Shared memory: the boxes, then (with the load stream) its ring, mbarriers and stop flag.
  const int box_bytes = cfg.write == ProbeWrite::kTmaAddWarp ? 8 * cfg.bufs * 16 * cfg.box_cols * 4
                                                             : 2 * cfg.bufs * 64 * cfg.box_cols * 4;
  const bool loads = cfg.load_kb_cycles >= 0;
  if (loads && (box_bytes > 48 * 1024 || cfg.load_src == nullptr || cfg.load_rows < 64 || cfg.load_rows % 64 != 0 ||
                cfg.load_rows > (1 << 30)))
    return fail("the load stream needs boxes of at most 48 KiB and load_src of a positive multiple of 64 rows");
  const uint32_t load_off = (static_cast<uint32_t>(box_bytes) + 1023u) & ~1023u;
  const uint32_t bar_off = load_off + (loads ? kLoadStages * kLoadKb : 0);
  const int smem = static_cast<int>(bar_off) + 64 + 1024;

  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(N), static_cast<cuuint64_t>(M), static_cast<cuuint64_t>(E)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(N) * 4, static_cast<cuuint64_t>(N) * M * 4};
  const cuuint32_t box_rows = cfg.write == ProbeWrite::kTmaAddWarp ? 16 : 64;
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(cfg.box_cols), box_rows, 1}, pf_box[3] = {kTileN, kTileM, 1};
  const cuuint32_t elem[3] = {1, 1, 1};
  // Every map: element strides 1, no interleave, 256-byte L2 promotion, no fill for out-of-bounds elements.
  const auto encoder = tensor_map_encoder("wgrad_epilogue_probe");
  auto encode = [&](CUtensorMap& m, CUtensorMapDataType type, int rank, const void* ptr, const cuuint64_t* d,
                    const cuuint64_t* st, const cuuint32_t* b, CUtensorMapSwizzle sw) {
    return encoder(&m, type, static_cast<cuuint32_t>(rank), const_cast<void*>(ptr), d, st, b, elem,
                   CU_TENSOR_MAP_INTERLEAVE_NONE, sw, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                   CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
  };
  CUtensorMap mc{}, pf{}, ml{};
  if (!encode(mc, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3, dW, dims, strides, box,
              cfg.box_cols == 16 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_128B) ||
      !encode(pf, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3, dW, dims, strides, pf_box, CU_TENSOR_MAP_SWIZZLE_NONE))
    return fail("cuTensorMapEncodeTiled rejected dW");
  const cuuint64_t l_dims[2] = {4096, static_cast<cuuint64_t>(cfg.load_rows)}, l_strides[1] = {4096 * 2};
  const cuuint32_t l_box[2] = {64, 64};
  if (loads && !encode(ml, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, cfg.load_src, l_dims, l_strides, l_box,
                       CU_TENSOR_MAP_SWIZZLE_128B))
    return fail("cuTensorMapEncodeTiled rejected load_src");

  if (cudaFuncSetAttribute(reinterpret_cast<const void*>(fn), cudaFuncAttributeMaxDynamicSharedMemorySize, smem) !=
      cudaSuccess)
    return fail("cannot reserve shared memory");
  // One pair of counters per process: zeroed before each launch, read back after it when asked for.
  static unsigned long long* counters = nullptr;
  if (counters == nullptr && cudaMalloc(&counters, 2 * sizeof(unsigned long long)) != cudaSuccess)
    return fail("cannot allocate the cycle counters");
  const ProbeArgs a{dW,     E, M, N, cfg.delay, cfg.stagger ? 1 : 0, cfg.prefetch ? 1 : 0, counters,
                    loads ? cfg.load_kb_cycles : -1, static_cast<int>(cfg.load_rows), load_off, bar_off};
  cudaMemsetAsync(counters, 0, 2 * sizeof(unsigned long long), stream);
  fn<<<cfg.ctas > 0 ? cfg.ctas : sms, 288, smem, stream>>>(mc, pf, ml, a);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return fail(cudaGetErrorString(e));
  if (cycles != nullptr) {
    unsigned long long h[2] = {0, 0};
    if (cudaMemcpyAsync(h, counters, sizeof(h), cudaMemcpyDeviceToHost, stream) != cudaSuccess ||
        cudaStreamSynchronize(stream) != cudaSuccess)
      return fail("the launch failed");
    cycles->epi_cycles = h[0];
    cycles->epilogues = h[1];
  }
  return true;
}

}  // namespace mxt::sm90
