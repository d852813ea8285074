// LM head + cross-entropy on the device, chunked over tokens so the [T, V] logits never exist at once.
//
// Per chunk of rows (set_lm_head_chunk_tokens; lm_head_chunk_tokens in the config, 4096 by default):
//   Z = h_chunk @ W^T                  (CudaOps::gemm, BF16 out: see the rounding note below)
//   per row: max, log-sum-exp (fp32), loss = lse - Z[label]; then in place Z <- grad_scale * (softmax - onehot)
//   dh_chunk = Z @ W                   (BF16, overwrite)
//   dW      += Z^T @ h_chunk           (F32, accumulate)
// dW's fp32 read-add-write is once per chunk (1 GiB each at V = 128256, d = 2048), so chunks are as large as the
// memory plan allows (the logits chunk is in the plan's scratch line). With dlogits given, the logits of all T
// rows are made in it (one chunk, no scratch) and left there as their gradient; the caller does the dW GEMM, over
// several micro-batches' rows at once (lm_head_wgrad_micro_batches: one read-add-write of dW per group).
// The per-row losses go to a [T] scratch and are summed in a fixed order by one block at the end, and one
// thread adds the total to loss_sum[0]: deterministic, no float atomics.
//
// Rounding note: HF computes the logits with a bf16 matmul and upcasts them to fp32 for the loss, so the logits
// are rounded to bf16 here too (the GEMM writes BF16 directly, which also halves the scratch). The softmax and
// log-sum-exp are then computed in fp32 from those bf16 values, and the logit gradient is rounded to bf16 (as
// the backward of HF's upcast does) before the two gradient GEMMs.
//
// Labels: -100 is ignored (zero loss, zero gradient row). A label outside [0, V) cannot be reported without a
// host sync, so it makes loss_sum NaN (visible in the logged loss) and gets a zero gradient row.
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <string>

#include "attention_device.cuh"
#include "ce_rows.cuh"
#include "ce_rows_sm90.hpp"
#include "cuda_common.cuh"
#include "cuda_context.cuh"
#include "cuda_ops.hpp"

namespace mxt {
namespace {

using cuda::kCeIgnore;
constexpr int kRowThreads = 512;
constexpr int kReduceThreads = 1024;

using cuda::expect_rows;


// One block per row of the chunk. Reads the BF16 logits, writes the row loss and (if grad) overwrites the row
// with grad_scale * (softmax - onehot) in BF16. Each element is read and then written by the same thread, and
// the label's logit is read by every thread before the first barrier, so the in-place update is race-free.
__global__ void ce_rows_kernel(cuda::bf16* __restrict__ z, const int32_t* __restrict__ labels, int64_t V,
                               float grad_scale, bool grad, float* __restrict__ row_loss) {
  const int64_t r = blockIdx.x;
  cuda::bf16* row = z + r * V;
  const int32_t y = labels[r];
  if (y == kCeIgnore || y < 0 || y >= V) {  // uniform over the block
    if (grad)
      for (int64_t v = threadIdx.x; v < V; v += blockDim.x) row[v] = __float2bfloat16(0.f);
    if (threadIdx.x == 0) row_loss[r] = y == kCeIgnore ? 0.f : NAN;
    return;
  }
  const float zy = cuda::ld(row, y);
  // Online max / sum of exponentials per thread, then combined over the block.
  float m = -INFINITY, s = 0.f;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const float x = cuda::ld(row, v);
    if (x > m) {
      s = s * expf(m - x) + 1.f;  // m = -inf at first: s = 0 * 0 + 1
      m = x;
    } else {
      s += expf(x - m);
    }
  }
  const float M = cuda::block_max(m);
  const float S = cuda::block_sum(m == -INFINITY ? 0.f : s * expf(m - M));
  const float lse = M + logf(S);
  if (threadIdx.x == 0) row_loss[r] = lse - zy;
  if (!grad) return;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const float p = expf(cuda::ld(row, v) - lse);
    cuda::st(row, v, grad_scale * (v == y ? p - 1.f : p));
  }
}

// 2^x in one MUFU.EX2 (the attention kernels' helper; outputs below 2^-126 flush to zero, probabilities far below
// bf16's resolution).
using cuda::attn::fast_exp2;
using cuda::attn::kLn2;
using cuda::attn::kLog2e;

// ce_rows_kernel with 16-byte accesses (V % 8 == 0, logits 16-byte aligned: every vocabulary of the configs):
// the running max moves once per 8 logits, and the exponentials are base-2 ones of the logits scaled by log2(e):
// one FFMA and one MUFU.EX2 each against about 10 instructions for expf, as the pass ran at 0.86 ms per 8x7B
// micro-batch in the step (2.1 GB: 0.58 of the copy rate) at the power cap's clock. Measured in session 38: the
// step +0.2% (within noise); the op alone at full clock unchanged. The probabilities differ from expf's by a few
// fp32 ulps, far below the bf16 rounding of the gradient.
__global__ void ce_rows_vec_kernel(cuda::bf16* __restrict__ z, const int32_t* __restrict__ labels, int64_t V,
                                   float grad_scale, bool grad, float* __restrict__ row_loss) {
  const int64_t r = blockIdx.x;
  const int32_t V8 = static_cast<int32_t>(V / 8);
  cuda::bf16* row = z + r * V;
  const int32_t y = labels[r];
  if (y == kCeIgnore || y < 0 || y >= V) {
    if (grad) {
      const float zero[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      for (int32_t c = threadIdx.x; c < V8; c += blockDim.x) cuda::store8(row + 8 * c, zero);
    }
    if (threadIdx.x == 0) row_loss[r] = y == kCeIgnore ? 0.f : NAN;
    return;
  }
  const float zy = cuda::ld(row, y);
  float m = -INFINITY, s = 0.f;  // running max and sum in base-2 units: m = max(x) log2(e), s = sum 2^(x log2(e) - m)
  for (int32_t c = threadIdx.x; c < V8; c += blockDim.x) {
    float x[8];
    cuda::load8(row + 8 * c, x);
    cuda::ce_accumulate8(x, m, s);
  }
  const float M = cuda::block_max(m);
  const float S = cuda::block_sum(m == -INFINITY ? 0.f : s * fast_exp2(m - M));
  const float lse2 = M + log2f(S);
  if (threadIdx.x == 0) row_loss[r] = lse2 * kLn2 - zy;
  if (!grad) return;
  for (int32_t c = threadIdx.x; c < V8; c += blockDim.x) {
    float x[8];
    cuda::load8(row + 8 * c, x);
    cuda::ce_softmax8(x, lse2, grad_scale);
    cuda::store8(row + 8 * c, x);
  }
  // The label's element again, by the thread that stored its vector (program order: this store lands last).
  if (threadIdx.x == (y / 8) % blockDim.x)
    row[y] = __float2bfloat16(grad_scale * (fast_exp2(fmaf(zy, kLog2e, -lse2)) - 1.f));
}

// One block: loss_sum[0] += sum_t row_loss[t], in fp64 and a fixed order.
__global__ void loss_reduce_kernel(const float* __restrict__ row_loss, int64_t T, float* __restrict__ loss_sum) {
  __shared__ double partial[kReduceThreads / 32];
  double acc = 0.0;
  for (int64_t t = threadIdx.x; t < T; t += blockDim.x) acc += row_loss[t];
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) partial[warp] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) total += partial[w];
    loss_sum[0] = static_cast<float>(static_cast<double>(loss_sum[0]) + total);
  }
}

// MXTRAIN_CE_ROWS=cluster|row: the cross-entropy pass as 4-CTA clusters holding the row in shared memory (default
// where the device runs sm90a code; ce_rows_sm90.cu: 4.8% faster as a whole lm_head_loss at hidden 64, docs/perf.md
// session 39) or per row. Read at every call.
std::atomic<const char*> g_ce_rows_impl{"none"};

bool ce_cluster_rows() {
  const char* e = std::getenv("MXTRAIN_CE_ROWS");
  if (e == nullptr || *e == 0 || std::string(e) == "cluster") return true;
  if (std::string(e) == "row") return false;
  cuda::fail("lm_head_loss", std::string("environment MXTRAIN_CE_ROWS=") + e + ": expected row or cluster");
}

}  // namespace

const char* cuda::last_ce_rows_impl() { return g_ce_rows_impl.load(); }

CudaOps::LmHeadDims CudaOps::check_lm_head(const char* op, const Tensor& h, const Tensor& W, const Tensor& labels,
                                           const Tensor& loss_sum, const Tensor& dh, const Tensor& dW,
                                           const Tensor& dlogits) {
  const int64_t T = labels.numel(), V = W.ndim ? W.shape[0] : 0;
  const int64_t d = V ? W.numel() / V : 0;
  if (V < 1) cuda::fail(op, "W must be [V, d], got " + W.shape_str());
  expect_rows(h, T, d, op, "h");
  cuda::expect_numel(loss_sum, 1, op, "loss_sum");
  const bool grad = dh.numel() != 0, keep = dlogits.numel() != 0;
  if (keep && !grad) cuda::fail(op, "dlogits without dh: the logits' gradient is only made with the backward");
  if (grad) {
    expect_rows(dh, T, d, op, "dh");
    if (keep) expect_rows(dlogits, T, V, op, "dlogits");
    else expect_rows(dW, V, d, op, "dW");
  }
  return {T, V, d, grad, keep};
}

void CudaOps::lm_head_loss(const Tensor& h, const Tensor& W, const Tensor& labels, float grad_scale,
                           const Tensor& loss_sum, const Tensor& dh, const Tensor& dW, const Tensor& dlogits) {
  const char* op = "lm_head_loss";
  const auto [T, V, d, grad, keep] = check_lm_head(op, h, W, labels, loss_sum, dh, dW, dlogits);
  cuda::bf16* hp = cuda::bf16p(h, op, "h");
  (void)cuda::bf16p(W, op, "W");
  const int32_t* lab = cuda::i32(labels, op, "labels");
  float* ls = cuda::f32(loss_sum, op, "loss_sum");
  cuda::bf16* dhp = grad ? cuda::bf16p(dh, op, "dh") : nullptr;
  if (grad && !keep) (void)cuda::f32(dW, op, "dW");
  cuda::bf16* kept = keep ? cuda::bf16p(dlogits, op, "dlogits") : nullptr;
  if (T == 0) return;

  // Kept logits: one chunk of all T rows, in dlogits (no scratch).
  const int64_t chunk = keep ? T : lm_head_chunk_rows(T, lm_head_chunk_);
  cuda::bf16* logits = keep ? kept
                            : static_cast<cuda::bf16*>(ctx().scratch(
                                  "lm_head_loss.logits", static_cast<size_t>(chunk * V) * sizeof(cuda::bf16)));
  float* row_loss = static_cast<float*>(ctx().scratch("lm_head_loss.row_loss", static_cast<size_t>(T) * sizeof(float)));
  cudaStream_t st = ctx().stream;

  for (int64_t t0 = 0; t0 < T; t0 += chunk) {
    const int64_t n = chunk < T - t0 ? chunk : T - t0;
    const Tensor hc(hp + t0 * d, DType::BF16, {n, d}, Device::CUDA);
    const Tensor Z(logits, DType::BF16, {n, V}, Device::CUDA);
    gemm(false, true, n, V, d, 1.f, hc, W, 0.f, Z);  // bf16 logits, as HF
    if (ce_cluster_rows() && cuda::try_ce_rows_sm90(logits, lab + t0, n, V, grad_scale, grad, row_loss + t0,
                                                     ctx().device, st)) {
      g_ce_rows_impl = "cluster";
    } else if (V % 8 == 0 && cuda::aligned16(logits)) {
      g_ce_rows_impl = "row";
      ce_rows_vec_kernel<<<static_cast<unsigned>(n), kRowThreads, 0, st>>>(logits, lab + t0, V, grad_scale, grad,
                                                                           row_loss + t0);
    } else {
      g_ce_rows_impl = "scalar";
      ce_rows_kernel<<<static_cast<unsigned>(n), kRowThreads, 0, st>>>(logits, lab + t0, V, grad_scale, grad,
                                                                       row_loss + t0);
    }
    cuda::check_launch(op);
    if (!grad) continue;
    const Tensor dhc(dhp + t0 * d, DType::BF16, {n, d}, Device::CUDA);
    gemm(false, false, n, d, V, 1.f, Z, W, 0.f, dhc);     // dh_chunk = dZ @ W
    if (!keep) gemm(true, false, V, d, n, 1.f, Z, hc, 1.f, dW);  // dW += dZ^T @ h_chunk
  }
  loss_reduce_kernel<<<1, kReduceThreads, 0, st>>>(row_loss, T, ls);
  cuda::check_launch(op);
}

}  // namespace mxt
