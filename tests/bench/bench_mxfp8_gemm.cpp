// MXFP8 grouped GEMM benchmark (one GPU) at the Mixtral-8x7B expert shapes: 16,384 routed rows unevenly over 8
// experts, hidden 4096, intermediate 14336; forward, dgrad and wgrad of W13 [2 x 14336, 4096] and W2 [4096,
// 14336], with mxfp8.md's operand copies (quantised on the GPU from random bf16, never zeros). Rows per op:
//   mxfp8 sm90        our Hopper kernel (two temporaries: the next block's wgmma overlaps the promotion)
//   mxfp8 sm90 1tmp   the same with one temporary (issue, wait, promote): what the overlap buys
//   [sm90 acc+=tmp only], [sm90 no promotion]   timing-only variants with wrong results: the promotion cut to
//                     one FP32 op per element, and removed (the tensor-core + pipeline ceiling of this kernel);
//   [sm90 no scale loads]   full promotion with every scale 1.0 and no global scale loads (their cost)
//   [sm90 TMA+wgmma only]   neither scale loads nor promotion: the tile pipeline alone
//   mxfp8 baseline    the mma.sync kernel (fewer runs)
//   bf16 sm90         our bf16 grouped GEMM (CudaOps::grouped_gemm*, TMA + wgmma, 128 x 256)
//   cuBLASLt fp8 tensor   one dense cuBLASLt FP8 E4M3 GEMM of equal FLOPs, per-tensor scales, bf16 out
//   cuBLASLt fp8 1x128    the same with 1x128 block scales (A and B CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
//                         if cuBLASLt refuses, B 128x128 blocks), bf16 out
// The dense cuBLASLt GEMMs read the same K-major FP8 bytes (wgrad: the columnwise copies; its output is bf16,
// not the f32 read-add-write of ours, so it moves fewer bytes). Before timing, the sm90 outputs are compared
// with the baseline kernel's on the device (relative L2; wgrad from zeroed dW on both sides).
// Timing: CUDA events, warm-up, median of --runs runs, each after a 256 MiB memset that evicts L2.
//
// Usage: bench_mxfp8_gemm [--runs N] [--no-baseline] [--quantiser-only]
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "cuda_context.cuh"
#include "cuda_ops.hpp"
#include "mxfp8_cuda.hpp"
#include "mxtrain/device_info.hpp"
#include "sm90_grouped_gemm.cuh"

namespace {

using namespace mxt::bench;
using mxt::DType;
using mxt::Device;
using mxt::Tensor;
namespace mx = mxt::mxfp8;

bool lt_ok(cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS; }


// An MXFP8 copy on the device.
struct Mx {
  mxt::Ops* ops;
  mx::MxView v;
  Mx(mxt::Ops& o, int64_t batch, int64_t rows, int64_t cols, mx::Direction d) : ops(&o) {
    v.batch = batch;
    v.rows = rows;
    v.cols = cols;
    v.format = mx::Format::E4M3;
    v.dir = d;
    v.device = Device::CUDA;
    v.data = static_cast<uint8_t*>(o.alloc(static_cast<size_t>(v.data_bytes())));
    v.scales = static_cast<uint8_t*>(o.alloc(static_cast<size_t>(v.scale_bytes())));
  }
  Mx(const Mx&) = delete;
  Mx& operator=(const Mx&) = delete;
  ~Mx() {
    ops->release(v.data);
    ops->release(v.scales);
  }
};

// Random bf16 (a sum of two uniforms) times 2^u, u a random integer in [-3, 2], so block scales differ from block
// to block; never zeros. One 16 Mi-element chunk is drawn per tensor and repeated (host generation of the
// ~2.3 G elements here would take longer than the benchmark; the repetition does not matter for timing).
void fill_random(mxt::Ops& ops, const Tensor& t, uint64_t seed, float scale) {
  const int64_t n = t.numel(), chunk = 16 << 20;
  std::vector<uint16_t> h(static_cast<size_t>(std::min(n, chunk)));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  const float pow2[6] = {0.125f, 0.25f, 0.5f, 1.f, 2.f, 4.f};
  for (size_t i = 0; i < h.size(); ++i) {
    s += 0x9E3779B97F4A7C15ull;
    uint64_t z = s;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float u1 = static_cast<float>(z & 0xFFFF) / 65536.f, u2 = static_cast<float>((z >> 16) & 0xFFFF) / 65536.f;
    float v = (u1 + u2 - 1.f) * 1.7f * pow2[(z >> 32) % 6] * scale;
    if (v == 0.f) v = scale;
    h[i] = bf16_bits(v);
  }
  for (int64_t off = 0; off < n; off += chunk) {
    const int64_t m = std::min(chunk, n - off);
    ops.upload(static_cast<uint16_t*>(t.data) + off, h.data(), static_cast<size_t>(m) * 2);
  }
}


// ||a - b|| / ||b|| on the device; clobbers a.
double rel_l2_device(mxt::CudaOps& ops, const Tensor& a, const Tensor& b, const Tensor& acc2) {
  ops.zero(acc2);
  ops.sum_squares(b, acc2.rows(1, 1));
  ops.scale(a, -1.f);
  ops.add(a, b, a);
  ops.sum_squares(a, acc2.rows(0, 1));
  float h[2];
  ops.download(h, acc2.data, sizeof(h));
  return std::sqrt(static_cast<double>(h[0]) / std::max(static_cast<double>(h[1]), 1e-30));
}

// One dense cuBLASLt FP8 GEMM: D [n][m] (row-major, bf16) = B_op [n][k] x A_op [m][k]^T, both K-major E4M3
// (cuBLASLt's TN: A = the [m][k] operand, op T). mode 0: per-tensor scales; 1: 1x128 x 1x128; 2: 1x128 x 128x128.
struct LtFp8 {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool ok = false;
  ~LtFp8() {
    if (ld) cublasLtMatrixLayoutDestroy(ld);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (op) cublasLtMatmulDescDestroy(op);
  }
  LtFp8(mxt::CudaContext& ctx, int64_t m, int64_t n, int64_t k, int mode, const float* sa, const float* sb) {
    if (!lt_ok(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F))) return;
    const cublasOperation_t t = CUBLAS_OP_T, nn = CUBLAS_OP_N;
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t));
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &nn, sizeof(nn));
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof(sa));
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof(sb));
    if (mode > 0) {
      const int32_t ma = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
      const int32_t mb =
          mode == 1 ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F : CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
      if (!lt_ok(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &ma, sizeof(ma))) ||
          !lt_ok(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mb, sizeof(mb))))
        return;
    }
    if (!lt_ok(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, k, m, k)) ||
        !lt_ok(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, k, n, k)) ||
        !lt_ok(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, m, n, m)))
      return;
    cublasLtMatmulPreference_t pref = nullptr;
    cublasLtMatmulPreferenceCreate(&pref);
    size_t ws = ctx.workspace_bytes;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
    cublasLtMatmulHeuristicResult_t res{};
    int found = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(ctx.lt, op, la, lb, ld, ld, pref, 1, &res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (!lt_ok(st) || found == 0) return;
    algo = res.algo;
    ok = true;
  }
  bool run(mxt::CudaContext& ctx, const void* a, const void* b, void* d) {
    const float alpha = 1.f, beta = 0.f;
    return lt_ok(cublasLtMatmul(ctx.lt, op, &alpha, a, la, b, lb, &beta, d, ld, d, ld, &algo, ctx.workspace,
                                ctx.workspace_bytes, ctx.stream));
  }
};

struct Row {
  std::string op, impl;
  Timing t;
  double tflops = 0;
  std::string note;
};

}  // namespace

int main(int argc, char** argv) {
  int runs = 15;
  bool with_baseline = true, quantiser_only = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--runs" && i + 1 < argc) runs = std::atoi(argv[++i]);
    else if (a == "--no-baseline") with_baseline = false;
    else if (a == "--quantiser-only") quantiser_only = true;
    else {
      std::fprintf(stderr, "usage: %s [--runs N] [--no-baseline] [--quantiser-only]\n", argv[0]);
      return 2;
    }
  }
  if (runs < 1) return 2;
  if (mxt::cuda_device_count() == 0) {
    std::fprintf(stderr, "bench_mxfp8_gemm: no CUDA device\n");
    return 1;
  }
  try {
    auto base = mxt::make_cuda_ops();
    auto& ops = dynamic_cast<mxt::CudaOps&>(*base);
    mxt::CudaContext& ctx = ops.ctx();
    cudaStream_t st = ctx.stream;
    cudaDeviceProp prop{};
    ck(cudaGetDeviceProperties(&prop, ctx.device), "cudaGetDeviceProperties");
    std::printf("bench_mxfp8_gemm: %s, sm_%d%d, %d SMs, median of %d runs (L2 flushed before each)\n", prop.name,
                prop.major, prop.minor, prop.multiProcessorCount, runs);
    const size_t flush_bytes = 256ull << 20;
    void* flush = ops.alloc(flush_bytes);

    const int64_t R = 16384, d = 4096, f = 14336, E = 8;
    const double mult[8] = {1.30, 0.70, 1.15, 0.85, 1.05, 0.95, 1.25, 0.75};
    std::vector<int32_t> off(E + 1, 0);
    for (int64_t e = 0; e < E; ++e)
      off[e + 1] = e + 1 < E ? off[e] + static_cast<int32_t>(std::llround(R / 8.0 * mult[e])) : static_cast<int32_t>(R);
    std::printf("8x7B: %lld rows over %lld experts, loads", static_cast<long long>(R), static_cast<long long>(E));
    for (int64_t e = 0; e < E; ++e) std::printf(" %d", off[e + 1] - off[e]);
    std::printf("\n");
    Buf OFF(ops, DType::I32, {E + 1});
    ops.upload(OFF.t.data, off.data(), off.size() * 4);
    Buf acc2(ops, DType::F32, {2});

    // High-precision tensors and their copies (mxfp8.md's table).
    using D = mx::Direction;
    Buf x(ops, DType::BF16, {R, d}), w13(ops, DType::BF16, {E, 2 * f, d}), act(ops, DType::BF16, {R, f});
    Buf w2(ops, DType::BF16, {E, d, f}), dh13(ops, DType::BF16, {R, 2 * f}), dy(ops, DType::BF16, {R, d});
    fill_random(ops, x.t, 1, 1.f);
    fill_random(ops, w13.t, 2, 0.02f);
    fill_random(ops, act.t, 3, 1.f);
    fill_random(ops, w2.t, 4, 0.02f);
    fill_random(ops, dh13.t, 5, 1.f);
    fill_random(ops, dy.t, 6, 1.f);
    Mx x_r(ops, 1, R, d, D::Rowwise), x_c(ops, 1, R, d, D::Columnwise);
    Mx act_r(ops, 1, R, f, D::Rowwise), act_c(ops, 1, R, f, D::Columnwise);
    Mx dh_r(ops, 1, R, 2 * f, D::Rowwise), dh_c(ops, 1, R, 2 * f, D::Columnwise);
    Mx dy_r(ops, 1, R, d, D::Rowwise), dy_c(ops, 1, R, d, D::Columnwise);
    Mx w13_r(ops, E, 2 * f, d, D::Rowwise), w13_c(ops, E, 2 * f, d, D::Columnwise);
    Mx w2_r(ops, E, d, f, D::Rowwise), w2_c(ops, E, d, f, D::Columnwise);
    mx::quantize_cuda(ops, x.t, &x_r.v, &x_c.v);
    mx::quantize_cuda(ops, act.t, &act_r.v, &act_c.v);
    mx::quantize_cuda(ops, dh13.t, &dh_r.v, &dh_c.v);
    mx::quantize_cuda(ops, dy.t, &dy_r.v, &dy_c.v);
    mx::quantize_cuda(ops, w13.t, &w13_r.v, &w13_c.v);
    mx::quantize_cuda(ops, w2.t, &w2_r.v, &w2_c.v);
    ck(cudaStreamSynchronize(st), "quantise");
    {
      // hopper_gemm=bf16's passes over dh13 [R, 2f] (the largest activation): both copies as codes then the rowwise
      // one dequantised (two kernels), beside the rowwise copy straight to values with the columnwise codes from
      // the same pass (quantize_values_cuda). Bytes: bf16 in, codes and bf16 values out.
      Buf vals(ops, DType::BF16, {R, 2 * f});
      const double n = static_cast<double>(R) * 2 * f;
      auto codes = [&] { mx::quantize_cuda(ops, dh13.t, &dh_r.v, &dh_c.v); };
      auto deq = [&] { mx::dequantize_cuda(ops, dh_r.v, vals.t); };
      auto values = [&] { mx::quantize_values_cuda(ops, dh13.t, mx::Format::E4M3, vals.t, &dh_c.v); };
      const Timing tc = time_it(st, flush, flush_bytes, 3, runs, codes);
      const Timing td = time_it(st, flush, flush_bytes, 3, runs, deq);
      const Timing tv = time_it(st, flush, flush_bytes, 3, runs, values);
      std::printf("quantiser passes over dh13 [%lld x %lld] bf16:\n", static_cast<long long>(R),
                  static_cast<long long>(2 * f));
      std::printf("  both copies as codes      %.3f ms  %6.0f GB/s\n", tc.median_ms, n * 4 / (tc.median_ms * 1e6));
      std::printf("  rowwise codes -> values   %.3f ms  %6.0f GB/s\n", td.median_ms, n * 3 / (td.median_ms * 1e6));
      std::printf("  values + columnwise codes %.3f ms  %6.0f GB/s  (%.2fx the two passes)\n", tv.median_ms,
                  n * 5 / (tv.median_ms * 1e6), (tc.median_ms + td.median_ms) / tv.median_ms);
      std::fflush(stdout);
    }
    if (quantiser_only) {
      ops.release(flush);
      return 0;
    }

    // cuBLASLt scale tensors: ones, sized for the largest 1x128 layout of any operand here.
    const int64_t scale_n = (R / 128 + 1) * 2 * f + 1024;
    Buf ones(ops, DType::F32, {scale_n});
    {
      std::vector<float> h(static_cast<size_t>(scale_n), 1.f);
      ops.upload(ones.t.data, h.data(), h.size() * 4);
    }
    const float* one = static_cast<const float*>(ones.t.data);

    struct Op {
      const char* name;
      int kind;  // 0 forward, 1 dgrad, 2 wgrad
      const mx::MxView *A, *B;  // K-major operands as the MXFP8 kernels take them
      const Tensor *bf_in, *bf_w, *bf_x2;
      int64_t w_out, w_in;
    };
    const Op list[] = {
        {"fwd x@W13^T", 0, &x_r.v, &w13_r.v, &x.t, &w13.t, nullptr, 2 * f, d},
        {"fwd a@W2^T", 0, &act_r.v, &w2_r.v, &act.t, &w2.t, nullptr, d, f},
        {"dgrad dh13@W13", 1, &dh_r.v, &w13_c.v, &dh13.t, &w13.t, nullptr, 2 * f, d},
        {"dgrad dy@W2", 1, &dy_r.v, &w2_c.v, &dy.t, &w2.t, nullptr, d, f},
        {"wgrad W13", 2, &dh_c.v, &x_c.v, &dh13.t, nullptr, &x.t, 2 * f, d},
        {"wgrad W2", 2, &dy_c.v, &act_c.v, &dy.t, nullptr, &act.t, d, f},
    };
    std::vector<Row> rows;
    for (const Op& op : list) {
      const double flops = 2.0 * R * op.w_out * op.w_in;
      const int64_t M = op.A->op_rows(), N = op.B->op_rows(), K = op.A->op_k();
      std::unique_ptr<Buf> o1, o2;
      if (op.kind == 2) {
        o1.reset(new Buf(ops, DType::F32, {E, M, N}));
        o2.reset(new Buf(ops, DType::F32, {E, M, N}));
      } else {
        o1.reset(new Buf(ops, DType::BF16, {M, N}));
        o2.reset(new Buf(ops, DType::BF16, {M, N}));
      }
      const Tensor &c1 = o1->t, &c2 = o2->t;
      auto mxrun = [&](const Tensor& c) {
        if (op.kind == 2) mx::grouped_gemm_wgrad_cuda(ops, *op.A, *op.B, OFF.t, c);
        else mx::grouped_gemm_cuda(ops, *op.A, *op.B, OFF.t, c);
      };
      auto baserun = [&](const Tensor& c) {
        if (op.kind == 2) mx::grouped_gemm_wgrad_baseline_cuda(ops, *op.A, *op.B, OFF.t, c);
        else mx::grouped_gemm_baseline_cuda(ops, *op.A, *op.B, OFF.t, c);
      };
      const size_t first = rows.size();
      auto add = [&](const char* impl, const Timing& t, const std::string& note) {
        rows.push_back({op.name, impl, t, flops / (t.median_ms * 1e-3) / 1e12, note});
        const Row& r = rows.back();
        std::printf("  %-15s %-22s %8.3f ms %7.1f TFLOP/s  %s\n", r.op.c_str(), r.impl.c_str(), r.t.median_ms,
                    r.tflops, r.note.c_str());
        std::fflush(stdout);
      };

      // Correctness on the device first: sm90 against the baseline kernel, same operands.
      ops.zero(c1);
      ops.zero(c2);
      mxrun(c1);
      const std::string path = mx::last_gemm_impl();
      baserun(c2);
      ck(cudaStreamSynchronize(st), "check runs");
      const double err = rel_l2_device(ops, c1, c2, acc2.t);
      char note[96];
      std::snprintf(note, sizeof(note), "rel L2 vs baseline %.2e%s", err, path == "sm90" ? "" : " (NOT sm90)");
      const char* vnames[6] = {"mxfp8 sm90", "mxfp8 sm90 1tmp", "[sm90 acc+=tmp only]", "[sm90 no promotion]",
                               "[sm90 no scale loads]", "[sm90 TMA+wgmma only]"};
      for (int variant = 0; variant < 6; ++variant) {
        mx::set_gemm_variant(variant);
        const Timing t = time_it(st, flush, flush_bytes, 3, runs, [&] { mxrun(c1); });
        add(vnames[variant], t, variant == 0 ? note : (variant >= 2 ? "timing only (wrong results)" : ""));
      }
      mx::set_gemm_variant(0);
      if (with_baseline) add("mxfp8 baseline", time_it(st, flush, flush_bytes, 1, 3, [&] { baserun(c2); }), "");

      // Our bf16 grouped GEMM (bf16 operands, the same shapes).
      {
        std::unique_ptr<Buf> ob;
        if (op.kind == 2) ob.reset(new Buf(ops, DType::F32, {E, op.w_out, op.w_in}));
        else ob.reset(new Buf(ops, DType::BF16, {R, op.kind == 0 ? op.w_out : op.w_in}));
        const Tensor& cb = ob->t;
        auto bfrun = [&] {
          if (op.kind == 0) ops.grouped_gemm(*op.bf_in, *op.bf_w, OFF.t, cb);
          else if (op.kind == 1) ops.grouped_gemm_dgrad(*op.bf_in, *op.bf_w, OFF.t, cb);
          else ops.grouped_gemm_wgrad(*op.bf_in, *op.bf_x2, OFF.t, cb);
        };
        const Timing t = time_it(st, flush, flush_bytes, 3, runs, bfrun);
        add("bf16 sm90", t, std::string("path ") + mxt::sm90::last_grouped_impl());
      }

      // fp8_config.hopper_gemm=bf16, as the trainer runs it: the activation operands dequantised per call (timed),
      // the weight's copy dequantised once per step (not timed), then our bf16 grouped GEMM; checked against the
      // MXFP8 sm90 kernel on the same codes.
      {
        Buf a_deq(ops, DType::BF16, {op.A->data_bytes()});
        std::unique_ptr<Buf> b_deq(new Buf(ops, DType::BF16, {op.B->data_bytes()}));
        if (op.kind != 2) mx::dequantize_cuda(ops, *op.B, b_deq->t);
        const Tensor a_t = a_deq.t.view({op.A->rows, op.A->cols});
        const Tensor b_t = op.kind == 2 ? b_deq->t.view({op.B->rows, op.B->cols})
                                        : b_deq->t.view({op.B->batch, op.B->rows, op.B->cols});
        auto deqrun = [&](const Tensor& c) {
          mx::dequantize_cuda(ops, *op.A, a_t);
          if (op.kind == 0) {
            ops.grouped_gemm(a_t, b_t, OFF.t, c);
          } else if (op.kind == 1) {
            ops.grouped_gemm_dgrad(a_t, b_t, OFF.t, c);
          } else {
            mx::dequantize_cuda(ops, *op.B, b_t);
            ops.grouped_gemm_wgrad(a_t, b_t, OFF.t, c);
          }
        };
        ops.zero(c1);  // the timing runs above accumulated into c1 (wgrad)
        mxrun(c1);
        ops.zero(c2);
        deqrun(c2);
        ck(cudaStreamSynchronize(st), "dequantised run");
        char dnote[96];
        std::snprintf(dnote, sizeof(dnote), "rel L2 vs mxfp8 sm90 %.2e", rel_l2_device(ops, c2, c1, acc2.t));
        add("mxfp8 via bf16 (deq)", time_it(st, flush, flush_bytes, 3, runs, [&] { deqrun(c2); }), dnote);
      }

      // Dense cuBLASLt FP8 of equal FLOPs on the same K-major bytes: D [M][N] = A [M][K] x (B[0] [N][K])^T.
      {
        Buf dd(ops, DType::BF16, {M, N});
        const char* names[3] = {"cuBLASLt fp8 tensor", "cuBLASLt fp8 1x128", "cuBLASLt fp8 1x128.128x128"};
        bool vec_done = false;
        for (int mode = 0; mode < 3; ++mode) {
          if (mode == 2 && vec_done) break;
          LtFp8 lt(ctx, N, M, K, mode, one, one);  // cuBLASLt m = N (B rows), n = M (A rows)
          if (!lt.ok) {
            std::printf("  %-15s %-22s not supported by this cuBLASLt\n", op.name, names[mode]);
            continue;
          }
          bool good = true;
          const Timing t = time_it(st, flush, flush_bytes, 3, runs, [&] {
            good = lt.run(ctx, op.B->data, op.A->data, dd.t.data) && good;
          });
          if (!good) {
            std::printf("  %-15s %-22s cublasLtMatmul failed\n", op.name, names[mode]);
            continue;
          }
          add(names[mode], t, "dense, bf16 out");
          if (mode == 1) vec_done = true;
        }
      }
      // Ratios within this op.
      double bf = 0, tensor = 0, vec = 0;
      for (size_t i = first; i < rows.size(); ++i) {
        if (rows[i].impl == "bf16 sm90") bf = rows[i].tflops;
        if (rows[i].impl == "cuBLASLt fp8 tensor") tensor = rows[i].tflops;
        if (rows[i].impl.rfind("cuBLASLt fp8 1x128", 0) == 0) vec = rows[i].tflops;
      }
      for (size_t i = first; i < rows.size(); ++i) {
        char r[160];
        std::snprintf(r, sizeof(r), "%s%.2fx bf16, %.2fx fp8 tensor, %.2fx fp8 1x128", rows[i].note.empty() ? "" : "; ",
                      bf > 0 ? rows[i].tflops / bf : 0.0, tensor > 0 ? rows[i].tflops / tensor : 0.0,
                      vec > 0 ? rows[i].tflops / vec : 0.0);
        rows[i].note += r;
      }
    }
    ops.release(flush);
    std::printf("\n| op | impl | median ms | min ms | TFLOP/s | notes |\n| --- | --- | --- | --- | --- | --- |\n");
    for (const Row& r : rows)
      std::printf("| %s | %s | %.3f | %.3f | %.1f | %s |\n", r.op.c_str(), r.impl.c_str(), r.t.median_ms, r.t.min_ms,
                  r.tflops, r.note.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_mxfp8_gemm: %s\n", e.what());
    return 1;
  }
  return 0;
}
