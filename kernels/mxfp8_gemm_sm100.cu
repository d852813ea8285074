// The Blackwell path of the dense MXFP8 GEMMs: cuBLASLt's block-scaled FP8 GEMM (scale mode
// CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0, one E8M0 scale per 32 values along K: exactly our MXFP8 copies),
// which runs on sm_100 and later only. UNTESTED on a GPU: no Blackwell machine is lent to this project, so each
// shape's first eager call is checked against the baseline kernel and a shape that disagrees is retired (logged
// as an error). On any other device, or where cuBLASLt offers no algorithm, dense_gemm_sm100 launches nothing and
// returns false, and the callers run the grouped kernels instead (what every Hopper run does).
//
// cuBLASLt wants the scales in its tiled layout (mxtrain/mxfp8.hpp, tiled_scale_offset); tile_scales_cuda makes
// it from our [rows][K/32] order into per-op scratch. Row-major C = A B^T is handed over transposed, as in
// gemm_cublaslt.cu: cuBLASLt's "A" is our B ([N][K] = column-major K x N, used transposed), its "B" our A
// ([M][K] = column-major K x M), its D our C (column-major N x M).
#include <cublasLt.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>

#include <spdlog/spdlog.h>

#include "cuda_common.cuh"
#include "cuda_context.cuh"
#include "cuda_ops.hpp"
#include "mxfp8_cuda.hpp"

namespace mxt::mxfp8 {

namespace {

__global__ void tile_scales_kernel(const uint8_t* __restrict__ s, int64_t batch, int64_t rows, int64_t C,
                                   int64_t tiled, uint8_t* __restrict__ out) {
  const int64_t n = batch * rows * C;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t c = i % C, r = (i / C) % rows, b = i / (C * rows);
    out[b * tiled + tiled_scale_offset(r, c, C)] = s[i];
  }
}

struct Key {
  int device;
  int64_t M, N, K;
  int fa, fb, c_dtype;
  bool accumulate;
  size_t workspace;
  bool operator<(const Key& o) const {
    return std::tie(device, M, N, K, fa, fb, c_dtype, accumulate, workspace) <
           std::tie(o.device, o.M, o.N, o.K, o.fa, o.fb, o.c_dtype, o.accumulate, o.workspace);
  }
};

// One configuration's descriptors and algorithm; ok = false where cuBLASLt refused it (cached too, so a refused
// shape costs one query, not one per call).
struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool ok = false;
  int verdict = 0;  // the first-use check against the baseline kernel: 0 not yet, 1 agrees, -1 disagrees
  ~Plan() {
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

cudaDataType_t fp8_type(Format f) { return f == Format::E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2; }

void make_plan(Plan& p, const Key& k, cublasLtHandle_t lt) {
  auto good = [](cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS; };
  if (!good(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F))) return;
  const cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
  const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0;
  if (!good(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t))) ||
      !good(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof(n))) ||
      !good(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof(mode))) ||
      !good(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof(mode))))
    return;
  const cudaDataType_t d_type = k.c_dtype == static_cast<int>(DType::F32) ? CUDA_R_32F : CUDA_R_16BF;
  const uint64_t M = static_cast<uint64_t>(k.M), N = static_cast<uint64_t>(k.N), K = static_cast<uint64_t>(k.K);
  if (!good(cublasLtMatrixLayoutCreate(&p.a, fp8_type(static_cast<Format>(k.fb)), K, N, k.K)) ||
      !good(cublasLtMatrixLayoutCreate(&p.b, fp8_type(static_cast<Format>(k.fa)), K, M, k.K)) ||
      !good(cublasLtMatrixLayoutCreate(&p.d, d_type, N, M, k.N)))
    return;
  cublasLtMatmulPreference_t pref = nullptr;
  if (!good(cublasLtMatmulPreferenceCreate(&pref))) return;
  // Split-K only through the workspace, never in place with atomics: training repeats bit for bit.
  const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_MASK & ~static_cast<uint32_t>(CUBLASLT_REDUCTION_SCHEME_INPLACE);
  cublasLtMatmulHeuristicResult_t res{};
  int found = 0;
  if (good(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &k.workspace,
                                                sizeof(k.workspace))) &&
      good(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes,
                                                sizeof(schemes))) &&
      good(cublasLtMatmulAlgoGetHeuristic(lt, p.op, p.a, p.b, p.d, p.d, pref, 1, &res, &found)) && found > 0 &&
      good(res.state)) {
    p.algo = res.algo;
    p.ok = true;
  }
  cublasLtMatmulPreferenceDestroy(pref);
}

Plan* plan_for(const Key& k, cublasLtHandle_t lt) {
  static std::mutex mu;
  static std::map<Key, std::unique_ptr<Plan>> plans;
  std::lock_guard<std::mutex> lock(mu);
  std::unique_ptr<Plan>& p = plans[k];
  if (!p) {
    p = std::make_unique<Plan>();
    make_plan(*p, k, lt);
  }
  return p.get();
}

}  // namespace

void tile_scales_cuda(CudaOps& ops, const uint8_t* scales, int64_t batch, int64_t rows, int64_t C, uint8_t* out) {
  const char* op = "mxfp8::tile_scales_cuda";
  if (batch < 0 || rows < 0 || C < 0) cuda::fail(op, "negative extent");
  const int64_t tiled = tiled_scale_bytes(rows, C);
  cudaStream_t st = ops.ctx().stream;
  if (batch == 0 || tiled == 0) return;
  if (tiled != rows * C) cuda::check(cudaMemsetAsync(out, 0, batch * tiled, st), op, "memset");  // the padding
  const int threads = 256;
  tile_scales_kernel<<<cuda::blocks_for(batch * rows * C, threads), threads, 0, st>>>(scales, batch, rows, C, tiled,
                                                                                       out);
  cuda::check_launch(op);
}

namespace {

// C = A B^T + beta C through the plan, with both operands' scales tiled into per-op scratch.
void run_plan(CudaOps& ops, Plan& p, const MxView& A, const MxView& B, void* c, float beta) {
  CudaContext& ctx = ops.ctx();
  const char* op = "mxfp8::dense_gemm_sm100";
  const int64_t M = A.op_rows(), N = B.op_rows(), K = A.op_k(), kb = K / kBlock;
  uint8_t* sa = static_cast<uint8_t*>(ctx.scratch("mx_sm100_scales_a", tiled_scale_bytes(M, kb)));
  uint8_t* sb = static_cast<uint8_t*>(ctx.scratch("mx_sm100_scales_b", tiled_scale_bytes(N, kb)));
  tile_scales_cuda(ops, A.scales, 1, M, kb, sa);
  tile_scales_cuda(ops, B.scales, 1, N, kb, sb);
  // cuBLASLt's A is our B and its B our A: their scales swap the same way.
  if (cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sb, sizeof(sb)) !=
          CUBLAS_STATUS_SUCCESS ||
      cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sa, sizeof(sa)) !=
          CUBLAS_STATUS_SUCCESS)
    cuda::fail(op, "cannot set the scale pointers");
  const float alpha = 1.f;
  const cublasStatus_t s = cublasLtMatmul(ctx.lt, p.op, &alpha, B.data, p.a, A.data, p.b, &beta, c, p.d, c, p.d,
                                          &p.algo, ctx.workspace, ctx.workspace_bytes, ctx.stream);
  if (s != CUBLAS_STATUS_SUCCESS)
    cuda::fail(op, std::string("cublasLtMatmul failed: ") + cublasLtGetStatusName(s) + " for M=" + std::to_string(M) +
                       " N=" + std::to_string(N) + " K=" + std::to_string(K));
}

// The path has never run on a Blackwell GPU here, so each shape's first eager call checks it: A B^T from cuBLASLt
// against the baseline kernel (mma.sync, tested against the fp64 reference), both into temporaries, compared by
// relative L2 on the device. The two differ only in summation order and output rounding (about 1e-3); a wrong
// scale layout or operand order is off by O(1). Returns whether they agree.
bool agrees_with_baseline(CudaOps& ops, Plan& p, const MxView& A, const MxView& B, const Tensor& C,
                          const Tensor& offsets, bool wgrad) {
  const int64_t M = A.op_rows(), N = B.op_rows();
  void* got_p = ops.alloc(C.bytes());
  void* ref_p = ops.alloc(C.bytes());  // zero-filled: the baseline wgrad adds into it
  void* acc_p = ops.alloc(2 * sizeof(float));
  const Tensor got(got_p, C.dtype, {M, N}, Device::CUDA), ref(ref_p, C.dtype, {M, N}, Device::CUDA);
  const Tensor acc(acc_p, DType::F32, {2}, Device::CUDA);
  run_plan(ops, p, A, B, got_p, 0.f);
  if (wgrad)
    grouped_gemm_wgrad_baseline_cuda(ops, A, B, offsets, Tensor(ref_p, DType::F32, {1, M, N}, Device::CUDA));
  else
    grouped_gemm_baseline_cuda(ops, A, B, offsets, ref);
  ops.sum_squares(ref, acc.rows(1, 1));
  ops.scale(got, -1.f);
  ops.add(got, ref, got);
  ops.sum_squares(got, acc.rows(0, 1));
  float h[2] = {0.f, 0.f};
  ops.download(h, acc_p, sizeof(h));
  ops.release(acc_p);
  ops.release(ref_p);
  ops.release(got_p);
  const double rel = std::sqrt(static_cast<double>(h[0]) / std::max(static_cast<double>(h[1]), 1e-30));
  const bool ok = rel < 1e-2;  // false for NaN too
  if (ok)
    spdlog::info("MXFP8 dense GEMM M={} N={} K={}: cuBLASLt block-scaled result checked against the baseline kernel "
                 "(relative L2 difference {:.2e})",
                 M, N, A.op_k(), rel);
  else
    spdlog::error("MXFP8 dense GEMM M={} N={} K={}: cuBLASLt's block-scaled result differs from the baseline kernel's "
                  "by {:.3g} (relative L2); this shape runs on the generic MXFP8 kernels instead. Please report it",
                  M, N, A.op_k(), rel);
  return ok;
}

}  // namespace

bool dense_gemm_sm100(CudaOps& ops, const MxView& A, const MxView& B, const Tensor& C, float beta,
                      const Tensor& offsets) {
  CudaContext& ctx = ops.ctx();
  if (baseline_forced() || ctx.compute_capability < 100) return false;
  // Anything unusual goes to the grouped entry points, whose checks name the bad argument.
  if (A.device != Device::CUDA || B.device != Device::CUDA || C.device != Device::CUDA) return false;
  if (A.batch != 1 || B.batch != 1 || A.op_k() != B.op_k()) return false;
  const int64_t M = A.op_rows(), N = B.op_rows(), K = A.op_k();
  if (M <= 0 || N <= 0 || K <= 0 || M > INT32_MAX || N > INT32_MAX || K > INT32_MAX || C.numel() != M * N) return false;
  if (C.dtype != DType::BF16 && C.dtype != DType::F32) return false;
  if (!cuda::aligned16(A.data) || !cuda::aligned16(B.data) || !cuda::aligned16(C.data)) return false;
  const Key key{ctx.device, M, N, K, static_cast<int>(A.format), static_cast<int>(B.format),
                static_cast<int>(C.dtype), beta != 0.f, ctx.workspace_bytes};
  Plan* p = plan_for(key, ctx.lt);
  // Once per process, so a Blackwell run's log says which path its MXFP8 linears took.
  static std::once_flag said_no;
  if (!p->ok) {
    std::call_once(said_no, [&] {
      spdlog::warn("MXFP8 dense GEMM: cuBLASLt has no block-scaled algorithm for M={} N={} K={} on this GPU; such "
                   "shapes run on the generic MXFP8 kernels",
                   M, N, K);
    });
    return false;
  }
  if (p->verdict == 0) {
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    cuda::check(cudaStreamIsCapturing(ctx.stream, &capturing), "mxfp8::dense_gemm_sm100", "capture status");
    if (capturing != cudaStreamCaptureStatusNone) return false;  // checked at an eager call (the check syncs)
    p->verdict = agrees_with_baseline(ops, *p, A, B, C, offsets, beta != 0.f) ? 1 : -1;
  }
  if (p->verdict < 0) return false;
  run_plan(ops, *p, A, B, C.data, beta);
  note_gemm_impl("sm100");
  return true;
}

void dense_gemm_cuda(CudaOps& ops, const MxView& A, const MxView& B, const Tensor& all_rows, const Tensor& C) {
  if (dense_gemm_sm100(ops, A, B, C, 0.f, all_rows)) return;
  grouped_gemm_cuda(ops, A, B, all_rows, C);
}

void dense_gemm_wgrad_cuda(CudaOps& ops, const MxView& A, const MxView& B, const Tensor& all_k, const Tensor& C) {
  if (C.dtype == DType::F32 && dense_gemm_sm100(ops, A, B, C, 1.f, all_k)) return;
  grouped_gemm_wgrad_cuda(ops, A, B, all_k, C);
}

}  // namespace mxt::mxfp8
