// The LM head's cross-entropy pass (lm_head_loss.cu's ce_rows_vec_kernel) with each row read from HBM once:
// a cluster of kCluster CTAs per row, each bulk-loading its segment of the row (up to 64 KB at V = 128,256) into
// shared memory, reducing its max and sum there, exchanging the kCluster partials over distributed shared memory,
// and writing the logit gradient from shared memory with one bulk store.
// The per-row kernel reads each 256 KB row twice, with 4 rows in flight per SM (135 MB, more than L2): 0.86 ms
// per 8x7B micro-batch in the step (docs/perf.md, session 38). Session 35's 2-CTA cluster (one 125 KB half per CTA,
// one CTA per SM) did not overlap a CTA's loads with its stores; here 3 CTAs share an SM, so one's loads run under
// another's exchange and store. Measured (session 39): the whole lm_head_loss at hidden 64 4.8% faster, the pass
// in the 8x7B step 0.83 ms per micro-batch: at the capped clock its instruction issue is about as long as its
// memory time, so reading the rows once bought little there.
// Arithmetic per logit: the per-row kernel's (base-2 exponentials); the row's sums are combined in another order.
#include <cmath>
#include <cstdint>

#include "ce_rows.cuh"
#include "ce_rows_sm90.hpp"
#include "cuda_common.cuh"
#include "sm90_host.cuh"
#include "sm90_ptx.cuh"

namespace mxt::cuda {
namespace {

using attn::fast_exp2;
using attn::kLn2;
using attn::kLog2e;

constexpr int kCluster = 4;
constexpr int kThreads = 512;
constexpr int kMaxSegmentBytes = 200 * 1024;

// Dynamic shared memory: the segment (seg vectors of 8 bf16), then the load barrier and this CTA's (max, sum).
__global__ void __cluster_dims__(kCluster, 1, 1) __launch_bounds__(kThreads)
    ce_rows_cluster_kernel(bf16* __restrict__ z, const int32_t* __restrict__ labels, int64_t V, int32_t seg,
                           float grad_scale, bool grad, float* __restrict__ row_loss) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(16) uint8_t smem[];
  uint4* buf = reinterpret_cast<uint4*>(smem);
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem + static_cast<size_t>(seg) * 16);
  float2* part = reinterpret_cast<float2*>(bar + 1);
  __shared__ float lse2_shared;
  const int32_t rank = static_cast<int32_t>(sm90::cluster_ctarank());
  const int64_t r = blockIdx.x / kCluster;
  const int32_t V8 = static_cast<int32_t>(V / 8), c_lo = rank * seg;
  const int32_t n = c_lo < V8 ? min(seg, V8 - c_lo) : 0;  // this CTA's vectors
  bf16* row = z + r * V;
  const int32_t y = labels[r];
  if (y == kCeIgnore || y < 0 || y >= V) {  // uniform over the cluster; no shared memory is exchanged
    if (grad)
      for (int32_t c = threadIdx.x; c < n; c += blockDim.x)
        reinterpret_cast<uint4*>(row)[c_lo + c] = make_uint4(0, 0, 0, 0);
    if (rank == 0 && threadIdx.x == 0) row_loss[r] = y == kCeIgnore ? 0.f : NAN;
    return;
  }
  // The label's logit, read before any CTA of the cluster writes the row (all writes follow the first cluster
  // barrier below).
  const float zy = rank == 0 && threadIdx.x == 0 ? cuda::ld(row, y) : 0.f;
  if (threadIdx.x == 0) {
    sm90::mbar_init(bar, 1);
    sm90::fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0 && n > 0) {
    sm90::mbar_arrive_expect_tx(bar, static_cast<uint32_t>(n) * 16);
    sm90::bulk_load(sm90::smem_u32(buf), row + 8 * static_cast<int64_t>(c_lo), static_cast<uint32_t>(n) * 16,
                    sm90::smem_u32(bar));
  }
  if (n > 0) sm90::mbar_wait(bar, 0);
  float m = -INFINITY, s = 0.f;  // base-2 units, as ce_rows_vec_kernel
  for (int32_t c = threadIdx.x; c < n; c += blockDim.x) {
    float x[8];
    unpack8(buf[c], x);
    ce_accumulate8(x, m, s);
  }
  const float M = block_max(m);
  const float S = block_sum(m == -INFINITY ? 0.f : s * fast_exp2(m - M));
  if (threadIdx.x == 0) *part = make_float2(M, S);
  sm90::cluster_sync();  // every CTA's partial written and visible
  if (threadIdx.x == 0) {  // the kCluster partials in rank order: the same value in every CTA
    float2 p[kCluster];
    float Mr = -INFINITY;
#pragma unroll
    for (int q = 0; q < kCluster; ++q) {
      p[q] = sm90::ld_shared_cluster_f32x2(sm90::map_to_cta(sm90::smem_u32(part), static_cast<uint32_t>(q)));
      Mr = fmaxf(Mr, p[q].x);
    }
    float Sr = 0.f;
#pragma unroll
    for (int q = 0; q < kCluster; ++q) Sr += p[q].x == -INFINITY ? 0.f : p[q].y * fast_exp2(p[q].x - Mr);
    lse2_shared = Mr + log2f(Sr);
    if (rank == 0) row_loss[r] = lse2_shared * kLn2 - zy;
  }
  sm90::cluster_arrive();  // this CTA is done reading its peers' partials
  __syncthreads();
  const float lse2 = lse2_shared;
  if (grad) {
    for (int32_t c = threadIdx.x; c < n; c += blockDim.x) {
      float x[8];
      unpack8(buf[c], x);
      ce_softmax8(x, lse2, grad_scale);
      buf[c] = pack8(x);
    }
    __syncthreads();
    const int32_t yl = y - 8 * c_lo;  // the label's element, in this CTA's segment or not
    if (threadIdx.x == 0 && yl >= 0 && yl < 8 * n) {
      bf16* e = reinterpret_cast<bf16*>(buf) + yl;
      // its logit is the one the gradient loop just overwrote: read it from global memory, unwritten so far
      const float p = fast_exp2(fmaf(cuda::ld(row, y), kLog2e, -lse2));
      *e = __float2bfloat16(grad_scale * (p - 1.f));
    }
    sm90::fence_proxy_async_smem();
    __syncthreads();
    if (threadIdx.x == 0 && n > 0) {
      sm90::bulk_store(row + 8 * static_cast<int64_t>(c_lo), sm90::smem_u32(buf), static_cast<uint32_t>(n) * 16);
      sm90::bulk_commit_group();
      sm90::bulk_wait_group<0>();
    }
  }
  sm90::cluster_wait();  // no peer reads this CTA's partial any more
#endif
}

std::atomic<int> g_image[64];

}  // namespace

bool try_ce_rows_sm90(bf16* logits, const int32_t* labels, int64_t rows, int64_t V, float grad_scale, bool grad,
                      float* row_loss, int device, cudaStream_t stream) {
  const char* op = "lm_head_loss";
  if (rows == 0 || V % 8 != 0 || !aligned16(logits)) return false;
  const int64_t V8 = V / 8, seg = (V8 + kCluster - 1) / kCluster;
  const int64_t smem = seg * 16 + 16;
  if (smem > kMaxSegmentBytes || rows * kCluster > 0x7fffffffLL) return false;
  if (!sm90::device_runs_sm90a(device, reinterpret_cast<const void*>(ce_rows_cluster_kernel), g_image)) return false;
  static const bool opted_in = [op] {  // once, for the largest segment any call may use
    check(cudaFuncSetAttribute(ce_rows_cluster_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               kMaxSegmentBytes + 16),
          op, "cudaFuncSetAttribute");
    return true;
  }();
  (void)opted_in;
  ce_rows_cluster_kernel<<<static_cast<unsigned>(rows * kCluster), kThreads, static_cast<size_t>(smem), stream>>>(
      logits, labels, V, static_cast<int32_t>(seg), grad_scale, grad, row_loss);
  check_launch(op);
  return true;
}

}  // namespace mxt::cuda
