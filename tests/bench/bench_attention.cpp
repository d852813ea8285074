// Attention benchmark (one GPU): causal GQA forward, backward and forward+backward at B=1, S=4096 for the
// 8x1B shape (16 heads, 8 KV heads, head_dim 128), the 8x7B shape (32 / 8 / 128) and head_dim 64 (16 / 8 and
// 32 / 8), for each kernel set the dispatch offers (flash variant 0 = default: at head_dim 128 dQ from the dK/dV
// kernel's dS tiles; the same with the recomputing dQ kernel beside the dK/dV kernel (recompute-dq) and after it
// (one-stream), the same with the mma.sync dQ kernel, with both mma.sync
// backward kernels instead of the wgmma ones, the wgmma forward at 64 keys per step and at 128 with a 3-stage
// ring, flash variant 1, reference), plus the default kernels on packed rows (documents of 1024 tokens).
// FLOPs (the usual causal convention): forward 4 * B * H * S^2 * D / 2, backward 2.5x that; with documents,
// the same formula summed over documents (the work actually needed).
// Timing: CUDA events on the op stream around each call (forward alone, backward alone, forward then backward),
// after warm-up, median of --runs runs; operands random (uniform, never zeros).
// Before timing, each flash kernel set is checked against the reference kernels on the device (relative L2
// of out, lse, dq, dk, dv): a broken kernel shows up here, not as a fast number.
// scripts/bench_attention_torch.py prints the same table for PyTorch's flash SDPA.
//
// Usage: bench_attention [--runs N] [--shape 8x1B|8x7B|d64|d64h32|all] [--no-reference]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "cuda_context.cuh"
#include "cuda_ops.hpp"
#include "mxtrain/device_info.hpp"

namespace {

using namespace mxt::bench;
using mxt::AttnShape;
using mxt::DType;
using mxt::Device;
using mxt::Tensor;



// Uniform random bf16 in [-scale, scale) (splitmix64 on the host, uploaded).
void fill_random(mxt::Ops& ops, const Tensor& t, uint64_t seed, float scale) {
  const int64_t n = t.numel();
  std::vector<uint16_t> h(static_cast<size_t>(n));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < n; ++i) {
    s += 0x9E3779B97F4A7C15ull;
    uint64_t z = s;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float u = (static_cast<float>(z >> 40) / 16777216.f * 2.f - 1.f) * scale;
    h[static_cast<size_t>(i)] = bf16_bits(u);
  }
  ops.upload(t.data, h.data(), h.size() * 2);
}

std::vector<float> download(mxt::Ops& ops, const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  if (t.dtype == DType::F32) {
    ops.download(out.data(), t.data, out.size() * 4);
  } else {
    std::vector<uint16_t> h(out.size());
    ops.download(h.data(), t.data, h.size() * 2);
    for (size_t i = 0; i < h.size(); ++i) {
      const uint32_t u = static_cast<uint32_t>(h[i]) << 16;
      std::memcpy(&out[i], &u, 4);
    }
  }
  return out;
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = static_cast<double>(a[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return std::sqrt(num / (den > 0 ? den : 1e-30));
}

struct ShapeDef {
  const char* name;
  int64_t H, KVH, D;
};

struct Impl {
  const char* name;
  const char* attention;  // MXTRAIN_ATTENTION
  const char* variant;    // MXTRAIN_ATTENTION_VARIANT
  bool docs;
  const char* concurrent = "1";  // MXTRAIN_ATTENTION_BWD_CONCURRENT
  const char* dkv = "auto";       // MXTRAIN_ATTENTION_DKV
  const char* dq = "auto";        // MXTRAIN_ATTENTION_DQ
  const char* fwd = "auto";       // MXTRAIN_ATTENTION_FWD
  const char* fwd_sched = "pingpong";  // MXTRAIN_ATTENTION_FWD_SCHED
  const char* dq_sched = "pingpong";   // MXTRAIN_ATTENTION_DQ_SCHED
  const char* fwd_keys = "";           // MXTRAIN_ATTENTION_FWD_KEYS (empty: the default)
  const char* fwd_stages = "";         // MXTRAIN_ATTENTION_FWD_STAGES
  const char* ds = "auto";             // MXTRAIN_ATTENTION_DS
};

void set_impl(const Impl& im) {
  setenv("MXTRAIN_ATTENTION", im.attention, 1);
  setenv("MXTRAIN_ATTENTION_VARIANT", im.variant, 1);
  setenv("MXTRAIN_ATTENTION_BWD_CONCURRENT", im.concurrent, 1);
  setenv("MXTRAIN_ATTENTION_DKV", im.dkv, 1);
  setenv("MXTRAIN_ATTENTION_DQ", im.dq, 1);
  setenv("MXTRAIN_ATTENTION_FWD", im.fwd, 1);
  setenv("MXTRAIN_ATTENTION_FWD_SCHED", im.fwd_sched, 1);
  setenv("MXTRAIN_ATTENTION_DQ_SCHED", im.dq_sched, 1);
  setenv("MXTRAIN_ATTENTION_FWD_KEYS", im.fwd_keys, 1);
  setenv("MXTRAIN_ATTENTION_FWD_STAGES", im.fwd_stages, 1);
  setenv("MXTRAIN_ATTENTION_DS", im.ds, 1);
}

// Median and min of `runs` timings (ms) of fn on the op stream, after `warm` untimed calls.
std::pair<double, double> time_ms(cudaStream_t st, int warm, int runs, const std::function<void()>& fn) {
  for (int i = 0; i < warm; ++i) fn();
  cudaEvent_t a, b;
  ck(cudaEventCreate(&a), "event");
  ck(cudaEventCreate(&b), "event");
  std::vector<double> t;
  for (int i = 0; i < runs; ++i) {
    ck(cudaEventRecord(a, st), "record");
    fn();
    ck(cudaEventRecord(b, st), "record");
    ck(cudaEventSynchronize(b), "sync");
    float ms = 0.f;
    ck(cudaEventElapsedTime(&ms, a, b), "elapsed");
    t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return {t[t.size() / 2], t.front()};
}

int run(int argc, char** argv) {
  int runs = 20;
  std::string which = "all";
  bool with_ref = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--runs" && i + 1 < argc) runs = std::max(1, std::atoi(argv[++i]));
    else if (a == "--shape" && i + 1 < argc) which = argv[++i];
    else if (a == "--no-reference") with_ref = false;
    else {
      std::fprintf(stderr, "bench_attention: unknown argument '%s'\nusage: bench_attention [--runs N] "
                   "[--shape 8x1B|8x7B|d64|d64h32|all] [--no-reference]\n", a.c_str());
      return 2;
    }
  }
  if (mxt::cuda_device_count() == 0) {
    std::fprintf(stderr, "bench_attention: no CUDA device\n");
    return 1;
  }
  const ShapeDef shapes[] = {{"8x1B", 16, 8, 128}, {"8x7B", 32, 8, 128}, {"d64", 16, 8, 64}, {"d64h32", 32, 8, 64}};
  const Impl impls[] = {{"flash-v0", "flash", "0", false},
                        {"flash-v0 recompute-dq", "flash", "0", false, "1", "auto", "auto", "auto", "pingpong",
                         "pingpong", "", "", "off"},
                        {"flash-v0 one-stream", "flash", "0", false, "0", "auto", "auto", "auto", "pingpong",
                         "pingpong", "", "", "off"},
                        {"flash-v0 mma-dq", "flash", "0", false, "1", "auto", "mma"},
                        {"flash-v0 mma", "flash", "0", false, "1", "mma", "mma"},
                        {"flash-v0 mma-fwd", "flash", "0", false, "1", "auto", "auto", "mma"},
                        {"flash-v0 no-pp", "flash", "0", false, "1", "auto", "auto", "auto", "serial", "serial"},
                        {"flash-v0 fwd64", "flash", "0", false, "1", "auto", "auto", "auto", "pingpong",
                         "pingpong", "64"},
                        {"flash-v0 fwd128x3", "flash", "0", false, "1", "auto", "auto", "auto", "pingpong",
                         "pingpong", "128", "3"},
                        {"flash-v1", "flash", "1", false},
                        {"reference", "reference", "0", false}, {"flash-v0 docs1024", "flash", "0", true}};
  const int64_t B = 1, S = 4096, doc_len = 1024;

  auto ops_ptr = mxt::make_cuda_ops();
  auto& ops = *ops_ptr;
  cudaStream_t st = static_cast<mxt::CudaOps&>(ops).ctx().stream;
  cudaDeviceProp prop{};
  ck(cudaGetDeviceProperties(&prop, 0), "properties");
  std::printf("bench_attention: %s, %d SMs; B=%lld S=%lld causal GQA bf16; median of %d runs (min in "
              "brackets)\n", prop.name, prop.multiProcessorCount, static_cast<long long>(B),
              static_cast<long long>(S), runs);
  std::printf("%-8s %3s %3s %4s  %-18s %15s %7s %15s %7s %17s %7s\n", "shape", "H", "KVH", "D", "impl",
              "fwd ms [min]", "TFLOP/s", "bwd ms [min]", "TFLOP/s", "fwd+bwd ms [min]", "TFLOP/s");

  for (const ShapeDef& sh : shapes) {
    if (which != "all" && which != sh.name) continue;
    const int64_t T = B * S, H = sh.H, KVH = sh.KVH, D = sh.D;
    Buf q(ops, DType::BF16, {T, H, D}), k(ops, DType::BF16, {T, KVH, D}), v(ops, DType::BF16, {T, KVH, D});
    Buf o(ops, DType::BF16, {T, H, D}), lse(ops, DType::F32, {B, H, S}), dout(ops, DType::BF16, {T, H, D});
    Buf dq(ops, DType::BF16, {T, H, D}), dk(ops, DType::BF16, {T, KVH, D}), dv(ops, DType::BF16, {T, KVH, D});
    Buf docs(ops, DType::I32, {T});
    fill_random(ops, q.t, 1, 1.7f);
    fill_random(ops, k.t, 2, 1.7f);
    fill_random(ops, v.t, 3, 1.7f);
    fill_random(ops, dout.t, 4, 1.7f);
    {
      std::vector<int32_t> ids(static_cast<size_t>(T));
      for (int64_t t = 0; t < T; ++t) ids[static_cast<size_t>(t)] = static_cast<int32_t>((t % S) / doc_len);
      ops.upload(docs.t.data, ids.data(), ids.size() * 4);
    }
    const double fwd_flops = 4.0 * B * H * S * S * D / 2.0;
    const double doc_fwd_flops = 4.0 * B * H * (S / doc_len) * doc_len * doc_len * D / 2.0;

    // Reference results (plain causal and with documents) for the correctness check.
    std::vector<float> ref[2][5];
    for (int d = 0; d < 2; ++d) {
      AttnShape s{B, S, H, KVH, D, {}};
      if (d) s.doc_ids = docs.t;
      set_impl({"", "reference", "0", false});
      ops.attention_forward(s, q.t, k.t, v.t, o.t, lse.t);
      ops.attention_backward(s, dout.t, q.t, k.t, v.t, o.t, lse.t, dq.t, dk.t, dv.t);
      ops.synchronize();
      ref[d][0] = download(ops, o.t);
      ref[d][1] = download(ops, lse.t);
      ref[d][2] = download(ops, dq.t);
      ref[d][3] = download(ops, dk.t);
      ref[d][4] = download(ops, dv.t);
    }

    for (const Impl& im : impls) {
      const bool is_ref = std::strcmp(im.attention, "reference") == 0;
      if (is_ref && !with_ref) continue;
      AttnShape s{B, S, H, KVH, D, {}};
      if (im.docs) s.doc_ids = docs.t;
      set_impl(im);
      char check[160] = "";
      if (!is_ref) {
        ops.attention_forward(s, q.t, k.t, v.t, o.t, lse.t);
        ops.attention_backward(s, dout.t, q.t, k.t, v.t, o.t, lse.t, dq.t, dk.t, dv.t);
        ops.synchronize();
        const auto& r = ref[im.docs ? 1 : 0];
        std::snprintf(check, sizeof check, "  vs reference: out %.1e lse %.1e dq %.1e dk %.1e dv %.1e",
                      rel_l2(download(ops, o.t), r[0]), rel_l2(download(ops, lse.t), r[1]),
                      rel_l2(download(ops, dq.t), r[2]), rel_l2(download(ops, dk.t), r[3]),
                      rel_l2(download(ops, dv.t), r[4]));
      }
      const auto f = time_ms(st, 3, runs, [&] { ops.attention_forward(s, q.t, k.t, v.t, o.t, lse.t); });
      const auto bw = time_ms(st, 3, runs, [&] {
        ops.attention_backward(s, dout.t, q.t, k.t, v.t, o.t, lse.t, dq.t, dk.t, dv.t);
      });
      const auto fb = time_ms(st, 3, runs, [&] {
        ops.attention_forward(s, q.t, k.t, v.t, o.t, lse.t);
        ops.attention_backward(s, dout.t, q.t, k.t, v.t, o.t, lse.t, dq.t, dk.t, dv.t);
      });
      const double ff = im.docs ? doc_fwd_flops : fwd_flops;
      char line[512];
      std::snprintf(line, sizeof line,
                    "%-8s %3lld %3lld %4lld  %-18s %6.3f [%6.3f] %7.1f %6.3f [%6.3f] %7.1f %7.3f [%7.3f] %7.1f%s",
                    sh.name, static_cast<long long>(H), static_cast<long long>(KVH), static_cast<long long>(D),
                    im.name, f.first, f.second, ff / f.first / 1e9, bw.first, bw.second, 2.5 * ff / bw.first / 1e9,
                    fb.first, fb.second, 3.5 * ff / fb.first / 1e9, check);
      std::printf("%s\n", line);
      std::fflush(stdout);
    }
  }
  unsetenv("MXTRAIN_ATTENTION");
  unsetenv("MXTRAIN_ATTENTION_VARIANT");
  unsetenv("MXTRAIN_ATTENTION_BWD_CONCURRENT");
  unsetenv("MXTRAIN_ATTENTION_DKV");
  unsetenv("MXTRAIN_ATTENTION_DQ");
  unsetenv("MXTRAIN_ATTENTION_FWD");
  unsetenv("MXTRAIN_ATTENTION_DS");
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return mxt::bench::guarded_main("bench_attention", run, argc, argv); }
