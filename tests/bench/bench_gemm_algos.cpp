// cuBLASLt algorithm sweep (one GPU) for the trainer's dense GEMMs: the LM head's three GEMMs (and its weight
// gradient over 8 micro-batches' rows, lm_head_wgrad_micro_batches=8), the attention projections, and the dense
// GEMMs bench_grouped_gemm compares the experts' grouped GEMMs with (their tile and cluster), at the
// 8x7B and 8x1B shapes of the benchmarks (seq 4096, micro-batch 1, vocabulary 128,256). For each problem it
// times the heuristic's first --algos algorithms (gemm_candidates) and prints the first one, which
// CudaOps::gemm runs, beside the fastest: whether picking by measurement instead of by heuristic would pay.
// Operands are random bf16 (never zeros); each algorithm runs once untimed, then --runs times, median.
//
// Usage: bench_gemm_algos [--algos N] [--runs N] [--shape 8x7B|8x1B|all]
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "cuda_ops.hpp"

namespace {

using namespace mxt::bench;
using mxt::DType;
using mxt::Tensor;

struct Problem {
  std::string name;
  bool ta, tb;
  int64_t M, N, K;
  DType c;
  float beta;
};

std::vector<Problem> problems(int64_t d, int64_t kv_width, int64_t f, int64_t R, int64_t T, int64_t V,
                              int wgrad_group) {
  const int64_t qkv = d + 2 * kv_width;
  return {
      {"lm_head fwd  Z = h W^T", false, true, T, V, d, DType::BF16, 0.f},
      {"lm_head dgrad dh = Z W", false, false, T, d, V, DType::BF16, 0.f},
      {"lm_head wgrad dW += Z^T h", true, false, V, d, T, DType::F32, 1.f},
      {"lm_head wgrad x" + std::to_string(wgrad_group) + " micro-batches", true, false, V, d, T * wgrad_group,
       DType::F32, 1.f},
      // the same sums written transposed (dW^T = h^T Z): the operands swap roles in the kernel's tiling
      {"lm_head wgrad x" + std::to_string(wgrad_group) + ", dW^T = h^T Z", true, false, d, V, T * wgrad_group,
       DType::F32, 1.f},
      {"qkv fwd", false, true, T, qkv, d, DType::BF16, 0.f},
      {"qkv dgrad", false, false, T, d, qkv, DType::BF16, 0.f},
      {"qkv wgrad", true, false, qkv, d, T, DType::F32, 1.f},
      {"o fwd", false, true, T, d, d, DType::BF16, 0.f},
      {"o wgrad", true, false, d, d, T, DType::F32, 1.f},
      // bench_grouped_gemm's dense references (R routed rows, one expert's weights): which tile and cluster
      // cuBLASLt's heuristic runs at the expert shapes our grouped GEMM is compared with
      {"experts W13 fwd (dense)", false, true, R, 2 * f, d, DType::BF16, 0.f},
      {"experts W2 fwd (dense)", false, true, R, d, f, DType::BF16, 0.f},
      {"experts W13 dgrad (dense)", false, false, R, d, 2 * f, DType::BF16, 0.f},
      {"experts W2 dgrad (dense)", false, false, R, f, d, DType::BF16, 0.f},
      {"experts W13 wgrad (dense)", true, false, 2 * f, d, R, DType::F32, 1.f},
      {"experts W2 wgrad (dense)", true, false, d, f, R, DType::F32, 1.f},
  };
}

void bench(mxt::CudaOps& ops, const char* shape, int64_t d, int64_t kv_width, int64_t f, int64_t R, int algos,
           int runs) {
  const int64_t T = 4096, V = 128256;
  const int group = 8;
  for (const Problem& p : problems(d, kv_width, f, R, T, V, group)) {
    // Row-major op(A) [M, K], op(B) [K, N]: A stored [M, K] or [K, M], B stored [K, N] or [N, K].
    Buf a(ops, DType::BF16, {p.M * p.K}), b(ops, DType::BF16, {p.K * p.N}), c(ops, p.c, {p.M * p.N});
    fill_uniform(ops, a.t, 1, 1.f);
    fill_uniform(ops, b.t, 2, 0.02f);
    ck(cudaMemset(c.t.data, 0, c.t.bytes()), "memset C");
    const std::vector<mxt::GemmCandidate> cands =
        mxt::gemm_candidates(ops, p.ta, p.tb, p.M, p.N, p.K, 1.f, a.t, b.t, p.beta, c.t, algos, runs);
    if (cands.empty()) {
      std::printf("%-5s %-34s no algorithm\n", shape, p.name.c_str());
      continue;
    }
    const double tflop = 2.0 * p.M * p.N * p.K / 1e12;
    const mxt::GemmCandidate* first = &cands[0];
    const mxt::GemmCandidate* best = first;
    for (const auto& g : cands)
      if (g.ms < best->ms) best = &g;
    std::printf("%-5s %-34s M=%-6lld N=%-6lld K=%-6lld heuristic #%d %8.3f ms %6.1f TFLOP/s | best #%d %8.3f ms %6.1f "
                "TFLOP/s | gain %5.1f%% (%d algos)\n",
                shape, p.name.c_str(), static_cast<long long>(p.M), static_cast<long long>(p.N),
                static_cast<long long>(p.K), first->rank, first->ms, tflop / first->ms * 1e3, best->rank, best->ms,
                tflop / best->ms * 1e3, (first->ms / best->ms - 1.0) * 100.0, static_cast<int>(cands.size()));
    std::printf("      first: %s\n      best:  %s\n", first->config.c_str(), best->config.c_str());
    std::fflush(stdout);
  }
}

int run(int argc, char** argv) {
  int algos = 16, runs = 5;
  std::string shape = "all";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      return argv[++i];
    };
    if (a == "--algos") algos = std::stoi(next());
    else if (a == "--runs") runs = std::stoi(next());
    else if (a == "--shape") shape = next();
    else throw std::invalid_argument("unknown argument " + a + " (usage: bench_gemm_algos [--algos N] [--runs N] "
                                     "[--shape 8x7B|8x1B|all])");
  }
  if (shape != "all" && shape != "8x7B" && shape != "8x1B")
    throw std::invalid_argument("--shape must be 8x7B, 8x1B or all, got " + shape);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("bench_gemm_algos: no CUDA device, nothing to measure\n");
    return 0;
  }
  mxt::CudaOps ops(0);
  // Routed rows as bench_grouped_gemm has them: 8x7B 16,384, 8x1B 32,768.
  if (shape != "8x1B") bench(ops, "8x7B", 4096, 1024, 14336, 16384, algos, runs);
  if (shape != "8x7B") bench(ops, "8x1B", 2048, 1024, 4096, 32768, algos, runs);
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return mxt::bench::guarded_main("bench_gemm_algos", run, argc, argv); }
