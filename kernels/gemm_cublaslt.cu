// CudaOps::gemm through cuBLASLt: row-major C[M,N] = alpha op(A) op(B) + beta C, A and B BF16 with C BF16 or F32,
// or all three F32 (backend=cuda-fp32); fp32 compute (CUBLAS_COMPUTE_32F: no TF32), on the context's stream and
// workspace.
//
// Row-major is handled with the transpose identity: a row-major [r, c] buffer is a column-major [c, r] one, so
// the row-major product C = op(A) op(B) is, seen column-major, C^T = op(B)^T op(A)^T. We therefore hand
// cuBLASLt the buffer of B as its first operand and the buffer of A as its second, with m = N, n = M, k = K and
// the transposes unchanged:
//   Lt "A" = buffer B: column-major [N, K] (ld N) if !trans_b, or [K, N] (ld K) used transposed if trans_b
//   Lt "B" = buffer A: column-major [K, M] (ld K) if !trans_a, or [M, K] (ld M) used transposed if trans_a
//   Lt "C"/"D" = buffer C: column-major [N, M], ld N
//
// Matmul / layout descriptors and the heuristic's algorithm are cached per (device, shape, transposes, dtypes,
// operand alignments, workspace size) in a small host-side map, so repeated calls skip the heuristic query.
// gemm_candidates (cuda_ops.hpp) times the heuristic's first few algorithms for one problem: the evidence for
// whether its first choice is worth second-guessing (bench_gemm_algos).
#include <cublasLt.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "cuda_common.cuh"
#include "cuda_context.cuh"
#include "cuda_ops.hpp"
#include "gemm_algo_pick.hpp"

namespace mxt {

namespace {

// C = beta * C for the K = 0 case (op(A) op(B) is all zeros). beta = 0 writes zeros (clears NaN garbage).
template <typename T>
__global__ void scale_matrix_kernel(T* __restrict__ c, int64_t n, float beta) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float v = beta == 0.f ? 0.f : beta * cuda::ld(c, i);
    cuda::st(c, i, v);
  }
}

// Largest power of two (<= 256) dividing the address: cuBLASLt's heuristic must not assume more alignment than
// a view into a larger buffer actually has.
uint32_t pointer_alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && (a % align) != 0) align >>= 1;
  return align;
}

struct PlanKey {
  int device;
  bool trans_a, trans_b;
  int64_t M, N, K;
  int ab_dtype, c_dtype;
  uint32_t align_a, align_b, align_c;
  size_t workspace;
  bool operator<(const PlanKey& o) const {
    return std::tie(device, trans_a, trans_b, M, N, K, ab_dtype, c_dtype, align_a, align_b, align_c, workspace) <
           std::tie(o.device, o.trans_a, o.trans_b, o.M, o.N, o.K, o.ab_dtype, o.c_dtype, o.align_a, o.align_b,
                    o.align_c, o.workspace);
  }
};

// Owns the descriptors of one cached matmul configuration.
struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;  // in cuBLASLt's (column-major) roles
  cublasLtMatmulAlgo_t algo{};
  size_t workspace_needed = 0;
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

constexpr size_t kMaxCachedPlans = 256;

struct PlanCache {
  std::mutex mu;
  std::map<PlanKey, Plan*> plans;
  ~PlanCache() { clear(); }
  void clear() {
    for (auto& kv : plans) delete kv.second;
    plans.clear();
  }
};

PlanCache& plan_cache() {
  static PlanCache cache;
  return cache;
}

std::string describe(const PlanKey& k) {
  return "M=" + std::to_string(k.M) + " N=" + std::to_string(k.N) + " K=" + std::to_string(k.K) +
         " trans_a=" + (k.trans_a ? "1" : "0") + " trans_b=" + (k.trans_b ? "1" : "0") +
         " A,B=" + (k.ab_dtype == static_cast<int>(DType::F32) ? "f32" : "bf16") +
         " C=" + (k.c_dtype == static_cast<int>(DType::F32) ? "f32" : "bf16");
}

void check_lt(cublasStatus_t st, const char* what, const PlanKey& k) {
  if (st != CUBLAS_STATUS_SUCCESS)
    cuda::fail("gemm", std::string(what) + " failed: " + cublasLtGetStatusName(st) + " (" +
                           cublasLtGetStatusString(st) + ") for " + describe(k));
}

std::string algo_config(const cublasLtMatmulAlgo_t& algo) {
  auto get = [&](cublasLtMatmulAlgoConfigAttributes_t attr) {
    uint32_t v = 0;
    size_t written = 0;
    if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof(v), &written) != CUBLAS_STATUS_SUCCESS) return -1;
    return static_cast<int>(v);
  };
  return "algo " + std::to_string(get(CUBLASLT_ALGO_CONFIG_ID)) + " tile " + std::to_string(get(CUBLASLT_ALGO_CONFIG_TILE_ID)) +
         " stages " + std::to_string(get(CUBLASLT_ALGO_CONFIG_STAGES_ID)) + " splitk " +
         std::to_string(get(CUBLASLT_ALGO_CONFIG_SPLITK_NUM)) + " swizzle " +
         std::to_string(get(CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING)) + " cluster " +
         std::to_string(get(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID));
}

// MXTRAIN_GEMM_ALGO (gemm_algo_pick.hpp), read once.
const GemmAlgoPick& algo_pick() {
  static const GemmAlgoPick v = [] {
    try {
      return parse_gemm_algo_pick(std::getenv("MXTRAIN_GEMM_ALGO"));
    } catch (const std::invalid_argument& e) {
      cuda::fail("gemm", e.what());
    }
  }();
  return v;
}

// Builds the descriptors and queries the heuristic for one configuration: its first `want` algorithms into
// `more` when given; into the plan its first, or the one MXTRAIN_GEMM_ALGO picks for this shape.
Plan* make_plan(const PlanKey& k, cublasLtHandle_t lt, int want = 1,
                std::vector<cublasLtMatmulHeuristicResult_t>* more = nullptr) {
  Plan* p = new Plan;
  const GemmAlgoPick& pick = algo_pick();
  const bool picked = pick.applies(k.M, k.N, k.K);
  try {
    const cudaDataType_t c_type = k.c_dtype == static_cast<int>(DType::F32) ? CUDA_R_32F : CUDA_R_16BF;
    const cudaDataType_t ab_type = k.ab_dtype == static_cast<int>(DType::F32) ? CUDA_R_32F : CUDA_R_16BF;
    check_lt(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate", k);
    const cublasOperation_t op_a = k.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // Lt "A" is the buffer of B
    const cublasOperation_t op_b = k.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // Lt "B" is the buffer of A
    check_lt(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)),
             "set TRANSA", k);
    check_lt(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)),
             "set TRANSB", k);
    const uint64_t M = static_cast<uint64_t>(k.M), N = static_cast<uint64_t>(k.N), K = static_cast<uint64_t>(k.K);
    // Column-major storage shapes (rows, cols, ld = rows) of the three buffers.
    const uint64_t a_rows = k.trans_b ? K : N, a_cols = k.trans_b ? N : K;
    const uint64_t b_rows = k.trans_a ? M : K, b_cols = k.trans_a ? K : M;
    check_lt(cublasLtMatrixLayoutCreate(&p->a, ab_type, a_rows, a_cols, static_cast<int64_t>(a_rows)),
             "cublasLtMatrixLayoutCreate(B)", k);
    check_lt(cublasLtMatrixLayoutCreate(&p->b, ab_type, b_rows, b_cols, static_cast<int64_t>(b_rows)),
             "cublasLtMatrixLayoutCreate(A)", k);
    check_lt(cublasLtMatrixLayoutCreate(&p->c, c_type, N, M, static_cast<int64_t>(N)),
             "cublasLtMatrixLayoutCreate(C)", k);

    cublasLtMatmulPreference_t pref = nullptr;
    check_lt(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate", k);
    const int asked = std::max(want < 1 ? 1 : want, picked ? pick.index + 1 : 1);
    std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(asked));
    int found = 0;
    cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                             &k.workspace, sizeof(k.workspace));
    // Alignment hints: Lt "A" is buffer B, Lt "B" is buffer A.
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &k.align_b,
                                                sizeof(k.align_b));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &k.align_a,
                                                sizeof(k.align_a));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &k.align_c,
                                                sizeof(k.align_c));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &k.align_c,
                                                sizeof(k.align_c));
    // Split-K reductions only through the workspace: the in-place scheme adds partial tiles into C with
    // atomics, whose order varies from run to run (training must repeat bit for bit).
    const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_MASK & ~static_cast<uint32_t>(CUBLASLT_REDUCTION_SCHEME_INPLACE);
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes,
                                                sizeof(schemes));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulAlgoGetHeuristic(lt, p->op, p->a, p->b, p->c, p->c, pref, static_cast<int>(results.size()),
                                          results.data(), &found);
    cublasLtMatmulPreferenceDestroy(pref);
    check_lt(st, "cublasLtMatmulAlgoGetHeuristic", k);
    if (found < 1 || results[0].state != CUBLAS_STATUS_SUCCESS)
      cuda::fail("gemm", "cuBLASLt found no algorithm for " + describe(k) + " (alignments A " +
                             std::to_string(k.align_a) + ", B " + std::to_string(k.align_b) + ", C " +
                             std::to_string(k.align_c) + " bytes)");
    const int chosen = picked ? std::min(pick.index, found - 1) : 0;
    p->algo = results[static_cast<size_t>(chosen)].algo;
    p->workspace_needed = results[static_cast<size_t>(chosen)].workspaceSize;
    if (picked)
      std::fprintf(stderr, "mxtrain: gemm %s runs the heuristic's algorithm %d of %d (MXTRAIN_GEMM_ALGO): %s\n",
                   describe(k).c_str(), chosen, found, algo_config(p->algo).c_str());
    if (more) more->assign(results.begin(), results.begin() + std::min(found, want < 1 ? 1 : want));
    return p;
  } catch (...) {
    delete p;
    throw;
  }
}

}  // namespace

namespace {

// Argument checks shared by gemm and gemm_candidates; false when there is nothing to multiply (M or N zero).
bool check_gemm_args(int64_t M, int64_t N, int64_t K, const Tensor& A, const Tensor& B, const Tensor& C) {
  const char* op = "gemm";
  if (M < 0 || N < 0 || K < 0)
    cuda::fail(op, "negative size M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K));
  cuda::expect_numel(A, M * K, op, "A");
  cuda::expect_numel(B, K * N, op, "B");
  cuda::expect_numel(C, M * N, op, "C");
  if (A.dtype == DType::F32) {  // the fp32 backend: all three fp32
    (void)cuda::f32(A, op, "A");
    (void)cuda::f32(B, op, "B");
    (void)cuda::f32(C, op, "C");
  } else {
    (void)cuda::bf16p(A, op, "A");
    (void)cuda::bf16p(B, op, "B");
  }
  if (C.dtype != DType::F32 && C.dtype != DType::BF16)
    cuda::fail(op, std::string("C must be f32 or bf16, got ") + dtype_name(C.dtype) + " " + C.shape_str());
  cuda::expect_dtype(C, C.dtype, op, "C");  // device / data checks
  // cuBLASLt layouts take 64-bit sizes, but keep the leading dimensions in a range every kernel handles.
  if (M > INT32_MAX || N > INT32_MAX || K > INT32_MAX)
    cuda::fail(op, "dimension exceeds 2^31-1: M=" + std::to_string(M) + " N=" + std::to_string(N) +
                       " K=" + std::to_string(K));
  return M != 0 && N != 0;
}

PlanKey plan_key(const CudaContext& c, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                 const Tensor& A, const Tensor& B, const Tensor& C) {
  return {c.device, trans_a, trans_b, M, N, K, static_cast<int>(A.dtype), static_cast<int>(C.dtype),
          pointer_alignment(A.data),
          pointer_alignment(B.data), pointer_alignment(C.data), c.workspace_bytes};
}


}  // namespace

std::vector<GemmCandidate> gemm_candidates(CudaOps& ops, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                                           float alpha, const Tensor& A, const Tensor& B, float beta,
                                           const Tensor& C, int max_algos, int reps) {
  std::vector<GemmCandidate> out;
  if (!check_gemm_args(M, N, K, A, B, C) || K == 0) return out;
  CudaContext& c = ops.ctx();
  const PlanKey key = plan_key(c, trans_a, trans_b, M, N, K, A, B, C);
  std::vector<cublasLtMatmulHeuristicResult_t> found;
  std::unique_ptr<Plan> plan(make_plan(key, c.lt, max_algos, &found));
  struct Events {  // destroyed on every way out
    cudaEvent_t e[2] = {nullptr, nullptr};
    ~Events() {
      for (cudaEvent_t x : e)
        if (x) cudaEventDestroy(x);
    }
  } events;
  cudaEvent_t* ev = events.e;
  cuda::check(cudaEventCreate(&ev[0]), "gemm_candidates", "cudaEventCreate");
  cuda::check(cudaEventCreate(&ev[1]), "gemm_candidates", "cudaEventCreate");
  reps = std::max(reps, 1);
  for (size_t i = 0; i < found.size(); ++i) {
    if (found[i].workspaceSize > c.workspace_bytes) continue;
    auto run = [&] {
      check_lt(cublasLtMatmul(c.lt, plan->op, &alpha, B.data, plan->a, A.data, plan->b, &beta, C.data, plan->c,
                              C.data, plan->c, &found[i].algo, c.workspace, c.workspace_bytes, c.stream),
               "cublasLtMatmul", key);
    };
    run();  // warm-up
    std::vector<float> ms;
    for (int r = 0; r < reps; ++r) {
      cuda::check(cudaEventRecord(ev[0], c.stream), "gemm_candidates", "cudaEventRecord");
      run();
      cuda::check(cudaEventRecord(ev[1], c.stream), "gemm_candidates", "cudaEventRecord");
      cuda::check(cudaEventSynchronize(ev[1]), "gemm_candidates", "cudaEventSynchronize");
      float m = 0;
      cuda::check(cudaEventElapsedTime(&m, ev[0], ev[1]), "gemm_candidates", "cudaEventElapsedTime");
      ms.push_back(m);
    }
    std::sort(ms.begin(), ms.end());
    out.push_back({static_cast<int>(i), ms[ms.size() / 2], algo_config(found[i].algo)});
  }
  return out;
}

void CudaOps::gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const Tensor& A,
                   const Tensor& B, float beta, const Tensor& C) {
  const char* op = "gemm";
  if (!check_gemm_args(M, N, K, A, B, C)) return;
  CudaContext& c = ctx();

  if (K == 0) {  // op(A) op(B) is all zeros: C = beta C
    const int64_t n = M * N;
    const int threads = 256;
    if (C.dtype == DType::F32)
      scale_matrix_kernel<float><<<cuda::blocks_for(n, threads), threads, 0, c.stream>>>(
          static_cast<float*>(C.data), n, beta);
    else
      scale_matrix_kernel<cuda::bf16><<<cuda::blocks_for(n, threads), threads, 0, c.stream>>>(
          static_cast<cuda::bf16*>(C.data), n, beta);
    cuda::check_launch(op);
    return;
  }

  const PlanKey key = plan_key(c, trans_a, trans_b, M, N, K, A, B, C);

  PlanCache& cache = plan_cache();
  std::lock_guard<std::mutex> lock(cache.mu);
  auto it = cache.plans.find(key);
  if (it == cache.plans.end()) {
    if (cache.plans.size() >= kMaxCachedPlans) cache.clear();  // host-side objects only: safe to drop
    Plan* p = make_plan(key, c.lt);
    it = cache.plans.emplace(key, p).first;
  }
  const Plan& plan = *it->second;
  // Lt "A" = buffer B, Lt "B" = buffer A (see the header comment).
  const cublasStatus_t st =
      cublasLtMatmul(c.lt, plan.op, &alpha, B.data, plan.a, A.data, plan.b, &beta, C.data, plan.c, C.data, plan.c,
                     &plan.algo, c.workspace, c.workspace_bytes, c.stream);
  check_lt(st, "cublasLtMatmul", key);
  stage_mark("cublasLt gemm");
}

}  // namespace mxt
