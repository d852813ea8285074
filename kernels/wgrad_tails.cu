// The weight gradient's tail set (mxtrain/wgrad_tails.hpp): each row set's rows of an expert past its last whole
// 64-row k-block, copied into one extra row set grouped by expert, set order within. Two launches: one block
// plans the copy from the device offsets (the counts never reach the host), then one block per (row, set, expert)
// copies a row of dy and of x.
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "cuda_common.cuh"
#include "mxtrain/wgrad_tails.hpp"
#include "sm90_sched.cuh"
#include "wgrad_tails.hpp"

namespace mxt::sm90 {
namespace {

constexpr int kPlanThreads = 256, kCopyThreads = 256;

struct TailSources {
  const uint4* dy[kMaxTailSets];
  const uint4* x[kMaxTailSets];
  const int32_t* off[kMaxTailSets];
  int32_t R[kMaxTailSets];
};

// plan[3 (s E + e) + {0, 1, 2}] = {first leaving row in set s, rows leaving, first tail row}; toff [E + 1]. Offsets
// are clamped into [0, R_s] and made non-decreasing as the GEMM reads them, so both see the same rows.
__global__ void plan_tails(TailSources src, int sets, int E, int32_t* plan, int32_t* toff) {
  __shared__ int32_t r[kMaxTailSets * kMaxTailExperts], first[kMaxTailSets * kMaxTailExperts];
  __shared__ int32_t off[kMaxTailExperts + 1], dst[kMaxTailSets * kMaxTailExperts];
  for (int i = threadIdx.x; i < sets * E; i += blockDim.x) {
    const int s = i / E, e = i % E;
    const int32_t lo = clamp_to(src.off[s][e], src.R[s]);
    int32_t hi = clamp_to(src.off[s][e + 1], src.R[s]);
    if (hi < lo) hi = lo;
    r[i] = wgrad_tail_rows(lo, hi);
    first[i] = hi - r[i];
  }
  __syncthreads();
  if (threadIdx.x == 0) wgrad_tail_layout(r, sets, E, off, dst);
  __syncthreads();
  for (int i = threadIdx.x; i < sets * E; i += blockDim.x) {
    plan[3 * i] = first[i];
    plan[3 * i + 1] = r[i];
    plan[3 * i + 2] = dst[i];
  }
  for (int e = threadIdx.x; e <= E; e += blockDim.x) toff[e] = off[e];
}

// Block (j, i): row j of (set, expert) i's leaving rows, if it has that many. Rows of 16-byte words (M, N % 8 == 0).
__global__ void copy_tails(TailSources src, int E, const int32_t* plan, int64_t m16, int64_t n16, uint4* tdy,
                           uint4* tx) {
  const int i = blockIdx.y, s = i / E;
  const int32_t j = blockIdx.x;
  if (j >= plan[3 * i + 1]) return;
  const int64_t from = plan[3 * i] + j, to = plan[3 * i + 2] + j;
  for (int64_t c = threadIdx.x; c < m16; c += blockDim.x) tdy[to * m16 + c] = src.dy[s][from * m16 + c];
  for (int64_t c = threadIdx.x; c < n16; c += blockDim.x) tx[to * n16 + c] = src.x[s][from * n16 + c];
}

}  // namespace

void gather_wgrad_tails(const WgradRows* sets, int nsets, int64_t E, int64_t M, int64_t N, __nv_bfloat16* tdy,
                        __nv_bfloat16* tx, int32_t* toff, int32_t* plan, cudaStream_t stream) {
  const char* op = "gather_wgrad_tails";
  if (nsets < 1 || nsets > kMaxTailSets || E < 1 || E > kMaxTailExperts || M % 8 || N % 8)
    cuda::fail(op, "needs 1-" + std::to_string(kMaxTailSets) + " sets, 1-" + std::to_string(kMaxTailExperts) +
                       " experts and widths that are multiples of 8 (got " + std::to_string(nsets) + ", " +
                       std::to_string(E) + ", " + std::to_string(M) + ", " + std::to_string(N) + ")");
  TailSources src{};
  for (int s = 0; s < nsets; ++s) {
    src.dy[s] = reinterpret_cast<const uint4*>(sets[s].dy);
    src.x[s] = reinterpret_cast<const uint4*>(sets[s].x);
    src.off[s] = sets[s].offsets;
    src.R[s] = static_cast<int32_t>(sets[s].R);
  }
  plan_tails<<<1, kPlanThreads, 0, stream>>>(src, nsets, static_cast<int>(E), plan, toff);
  cuda::check_launch(op);
  const dim3 grid(kWgradTailBlock - 1, static_cast<unsigned>(nsets * E));
  copy_tails<<<grid, kCopyThreads, 0, stream>>>(src, static_cast<int>(E), plan, M / 8, N / 8,
                                                reinterpret_cast<uint4*>(tdy), reinterpret_cast<uint4*>(tx));
  cuda::check_launch(op);
}

}  // namespace mxt::sm90
