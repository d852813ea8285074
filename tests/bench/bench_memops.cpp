// Memory-bound ops benchmark (one GPU): the trainer's element-wise and row kernels at one 8x7B micro-batch
// (T = 4,096 tokens, hidden 4,096, intermediate 14,336, 32 / 8 heads of 128, top-2 of 8 experts, vocab 128,256)
// and AdamW over 2^28 parameters, each beside the device's own copy rate measured in the same run
// (cudaMemcpyAsync device to device, 1 GiB: bytes read + written).
// Bytes are what each op must move at least (every input read once, every output written once), so
// "vs copy" is the fraction of the copy rate the op reaches: an op near 1.0 has nothing left to gain but fewer
// bytes; "vs it" compares with a copy of the op's own byte count, which a short op's ramp and tail also slow.
// Timing: CUDA events on the op stream, L2 flushed (256 MiB memset) before each call, median of --runs.
// Operands are random (never zeros); the ops' correctness is tested against their CPU twins in mxtrain_tests.
//
// The LM head's loss pass is timed inside lm_head_loss at hidden 64, with its two GEMMs (memory-bound there).
//
// Usage: bench_memops [--runs N] [--op NAME]    (NAME: one row, e.g. adamw; default all)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "cuda_context.cuh"
#include "cuda_ops.hpp"
#include "mxtrain/device_info.hpp"

namespace {

using namespace mxt::bench;
using mxt::DType;
using mxt::Tensor;

constexpr int64_t T = 4096, H = 4096, F = 14336, E = 8, K = 2, V = 128256, HQ = 32, HKV = 8, D = 128;
constexpr int64_t R = T * K;
constexpr int64_t kAdamN = int64_t{1} << 28;

struct Row {
  std::string op;
  double bytes = 0;
  Timing t, same;  // the op; a copy of the same bytes
};

// One step of a 64-bit LCG: the bench needs varied values, not good randomness.
uint64_t lcg(uint64_t& s) { return s = s * 6364136223846793005ull + 1442695040888963407ull; }

void fill_f32(mxt::Ops& ops, const Tensor& t, uint64_t seed, float lo, float hi) {
  std::vector<float> h(static_cast<size_t>(t.numel()));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 7;
  for (float& v : h) v = lo + (hi - lo) * static_cast<float>(lcg(s) >> 40) / 16777216.f;
  ops.upload(t.data, h.data(), h.size() * 4);
}

void upload_i32(mxt::Ops& ops, const Tensor& t, const std::vector<int32_t>& v) {
  ops.upload(t.data, v.data(), v.size() * 4);
}

// n ids uniform in [0, below).
std::vector<int32_t> random_ids(int64_t n, int64_t below, uint64_t seed) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int32_t& i : v) i = static_cast<int32_t>((lcg(seed) >> 33) % static_cast<uint64_t>(below));
  return v;
}

// A routing as moe_plan makes it: token t's k slots go to k distinct experts; permuted rows grouped by expert,
// slots ascending within an expert.
std::vector<int32_t> random_perm(uint64_t seed) {
  std::vector<int32_t> expert(static_cast<size_t>(R));
  uint64_t s = seed;
  for (int64_t t = 0; t < T; ++t) {
    lcg(s);
    const int a = static_cast<int>((s >> 33) % E);
    const int b = static_cast<int>((a + 1 + (s >> 45) % (E - 1)) % E);
    expert[static_cast<size_t>(t * K)] = a;
    expert[static_cast<size_t>(t * K + 1)] = b;
  }
  std::vector<int32_t> perm(static_cast<size_t>(R));
  std::iota(perm.begin(), perm.end(), 0);
  std::stable_sort(perm.begin(), perm.end(), [&](int32_t x, int32_t y) { return expert[x] < expert[y]; });
  return perm;
}

int run(int argc, char** argv) {
  int runs = 20;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--runs") && i + 1 < argc) {
      runs = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--op") && i + 1 < argc) {
      only = argv[++i];
    } else {
      std::fprintf(stderr, "usage: bench_memops [--runs N] [--op NAME]\n");
      return 2;
    }
  }
  if (runs < 1) throw std::runtime_error("--runs must be at least 1");
  if (mxt::cuda_device_count() == 0) throw std::runtime_error("no CUDA device");
  auto base = mxt::make_cuda_ops();
  auto& ops = dynamic_cast<mxt::CudaOps&>(*base);
  cudaStream_t st = ops.ctx().stream;
  cudaDeviceProp prop{};
  ck(cudaGetDeviceProperties(&prop, ops.ctx().device), "cudaGetDeviceProperties");
  std::printf("bench_memops: %s, %d SMs, median of %d runs (L2 flushed before each)\n", prop.name,
              prop.multiProcessorCount, runs);
  const size_t flush_bytes = 256ull << 20;
  void* flush = ops.alloc(flush_bytes);
  std::vector<Row> rows;
  // Each op also beside a copy of its own byte count (half read, half written): small ops pay the ramp and tail
  // of a short kernel that the 1 GiB copy does not.
  const size_t copy_cap = 15 * (kAdamN / 4) * 4;  // half of AdamW's bytes, the largest row
  void* copy_src = ops.alloc(copy_cap);
  void* copy_dst = ops.alloc(copy_cap);
  ck(cudaMemsetAsync(copy_src, 1, copy_cap, st), "memset");
  auto bench = [&](const std::string& name, double bytes, const std::function<void()>& fn) {
    if (!only.empty() && name.rfind(only, 0) != 0 && name != "copy") return;
    Row r{name, bytes, time_it(st, flush, flush_bytes, 3, runs, fn), {}};
    const size_t half = std::min(copy_cap, static_cast<size_t>(bytes / 2));
    r.same = time_it(st, flush, flush_bytes, 3, runs, [&] {
      ck(cudaMemcpyAsync(copy_dst, copy_src, half, cudaMemcpyDeviceToDevice, st), "copy");
    });
    rows.push_back(r);
  };

  {  // the reference: the device's copy rate
    Buf a(ops, DType::F32, {int64_t{1} << 28}), b(ops, DType::F32, {int64_t{1} << 28});
    ck(cudaMemsetAsync(a.t.data, 1, a.t.bytes(), st), "memset");
    bench("copy", 2.0 * static_cast<double>(a.t.bytes()),
          [&] { ck(cudaMemcpyAsync(b.t.data, a.t.data, a.t.bytes(), cudaMemcpyDeviceToDevice, st), "copy"); });
  }
  {  // AdamW: param, grad, m, v fp32 read and written (grad only read), bf16 working copy written
    Buf p(ops, DType::F32, {kAdamN}), g(ops, DType::F32, {kAdamN}), m(ops, DType::F32, {kAdamN}),
        v(ops, DType::F32, {kAdamN}), w(ops, DType::BF16, {kAdamN});
    fill_f32(ops, p.t, 1, -0.05f, 0.05f);
    fill_f32(ops, g.t, 2, -1e-3f, 1e-3f);
    fill_f32(ops, m.t, 3, -1e-4f, 1e-4f);
    fill_f32(ops, v.t, 4, 1e-10f, 1e-8f);
    mxt::AdamWStep s;
    s.lr = 1e-4f;
    s.weight_decay = 0.1f;
    s.step = 10;
    s.grad_scale = 0.5f;
    bench("adamw_step_to", 30.0 * kAdamN, [&] { ops.adamw_step_to(p.t, g.t, m.t, v.t, s, w.t); });
    Buf acc(ops, DType::F32, {1});
    ck(cudaMemsetAsync(acc.t.data, 0, 4, st), "memset");
    bench("sum_squares (fp32)", 4.0 * kAdamN, [&] { ops.sum_squares(g.t, acc.t); });
  }
  {  // SwiGLU over the routed rows
    Buf h13(ops, DType::BF16, {R, 2 * F}), a(ops, DType::BF16, {R, F}), da(ops, DType::BF16, {R, F}),
        dh13(ops, DType::BF16, {R, 2 * F}), wp(ops, DType::F32, {R}), dwp(ops, DType::F32, {R});
    fill_uniform(ops, h13.t, 11, 3.f);
    fill_uniform(ops, da.t, 12, 1.f);
    fill_f32(ops, wp.t, 13, 0.1f, 0.9f);
    bench("swiglu_forward", 2.0 * (R * 2 * F + R * F) + 4.0 * R, [&] { ops.swiglu_forward(h13.t, wp.t, a.t); });
    bench("swiglu_backward", 2.0 * (R * F + 2 * R * 2 * F) + 8.0 * R,
          [&] { ops.swiglu_backward(da.t, h13.t, wp.t, dh13.t, dwp.t); });
  }
  {  // RMSNorm, the residual add, RoPE, the embedding, the MoE permutes: [T, H] activations
    Buf x(ops, DType::BF16, {T, H}), y(ops, DType::BF16, {T, H}), dy(ops, DType::BF16, {T, H}),
        dx(ops, DType::BF16, {T, H}), w(ops, DType::BF16, {H}), rstd(ops, DType::F32, {T}),
        dw(ops, DType::F32, {H}), tmp(ops, DType::BF16, {T, H});
    fill_uniform(ops, x.t, 21, 2.f);
    fill_uniform(ops, dy.t, 22, 1.f);
    fill_uniform(ops, dx.t, 23, 1.f);
    fill_uniform(ops, w.t, 24, 1.f);
    const double th = 2.0 * T * H;
    bench("rmsnorm_forward", 2 * th + 4.0 * T, [&] { ops.rmsnorm_forward(x.t, w.t, 1e-5f, y.t, rstd.t); });
    bench("rmsnorm_backward_add", 4 * th + 4.0 * T,
          [&] { ops.rmsnorm_backward_add(dy.t, x.t, w.t, rstd.t, dx.t, dw.t, tmp.t); });
    bench("add", 3 * th, [&] { ops.add(x.t, dy.t, y.t); });

    Buf q(ops, DType::BF16, {T, HQ, D}), k(ops, DType::BF16, {T, HKV, D}), pos(ops, DType::I32, {T});
    fill_uniform(ops, q.t, 25, 1.f);
    fill_uniform(ops, k.t, 26, 1.f);
    std::vector<int32_t> hp(static_cast<size_t>(T));
    std::iota(hp.begin(), hp.end(), 0);
    upload_i32(ops, pos.t, hp);
    bench("rope_forward (q)", 2.0 * 2 * T * HQ * D, [&] { ops.rope_forward(q.t, pos.t, 1e6f); });
    bench("rope_forward (k)", 2.0 * 2 * T * HKV * D, [&] { ops.rope_forward(k.t, pos.t, 1e6f); });

    Buf table(ops, DType::BF16, {V, H}), ids(ops, DType::I32, {T});
    fill_uniform(ops, table.t, 27, 0.02f);
    upload_i32(ops, ids.t, random_ids(T, V, 99));
    bench("embedding_forward", 2 * th, [&] { ops.embedding_forward(ids.t, table.t, y.t); });
    {
      Buf dtable(ops, DType::F32, {V, H});
      ck(cudaMemsetAsync(dtable.t.data, 0, dtable.t.bytes(), st), "memset");
      bench("embedding_backward", th + 8.0 * T * H, [&] { ops.embedding_backward(ids.t, dy.t, dtable.t); });
    }

    Buf perm(ops, DType::I32, {R}), xp(ops, DType::BF16, {R, H});
    upload_i32(ops, perm.t, random_perm(5));
    fill_uniform(ops, xp.t, 28, 1.f);
    bench("moe_permute", th + 2.0 * R * H, [&] { ops.moe_permute(x.t, perm.t, static_cast<int>(K), xp.t); });
    bench("moe_unpermute", 2.0 * R * H + th, [&] { ops.moe_unpermute(xp.t, perm.t, static_cast<int>(K), y.t); });
    bench("moe_unpermute_add", 2.0 * R * H + 2 * th,
          [&] { ops.moe_unpermute_add(xp.t, perm.t, static_cast<int>(K), x.t, y.t, tmp.t); });
  }
  {  // lm_head_loss at hidden 64, where both GEMMs are memory-bound too: the logits [T, V] bf16 written by the
     // first GEMM, read and overwritten with their gradient by the loss pass, read by the dh GEMM (4 transfers).
    constexpr int64_t d = 64;
    Buf h(ops, DType::BF16, {T, d}), W(ops, DType::BF16, {V, d}), dh(ops, DType::BF16, {T, d}),
        dlogits(ops, DType::BF16, {T, V}), labels(ops, DType::I32, {T}), loss(ops, DType::F32, {1});
    fill_uniform(ops, h.t, 31, 1.f);
    fill_uniform(ops, W.t, 32, 1.f);
    upload_i32(ops, labels.t, random_ids(T, V, 77));
    ck(cudaMemsetAsync(loss.t.data, 0, 4, st), "memset");
    bench("lm_head_loss (hidden 64)", 4.0 * 2 * T * V,
          [&] { ops.lm_head_loss(h.t, W.t, labels.t, 1.f / T, loss.t, dh.t, Tensor(), dlogits.t); });
  }
  ops.release(flush);
  ops.release(copy_src);
  ops.release(copy_dst);

  const double copy_rate = rows.empty() ? 0 : rows[0].bytes / (rows[0].t.median_ms * 1e-3);
  std::printf("\n| op | median us | min us | GB moved | TB/s | vs copy | same-size copy us | vs it |\n"
              "| --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (const Row& r : rows) {
    const double rate = r.bytes / (r.t.median_ms * 1e-3);
    std::printf("| %s | %.1f | %.1f | %.3f | %.2f | %.2f | %.1f | %.2f |\n", r.op.c_str(), r.t.median_ms * 1e3,
                r.t.min_ms * 1e3, r.bytes / 1e9, rate / 1e12, copy_rate > 0 ? rate / copy_rate : 0.0,
                r.same.median_ms * 1e3, r.same.median_ms / r.t.median_ms);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return guarded_main("bench_memops", run, argc, argv); }
