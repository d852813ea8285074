#pragma once
// What the kernel benchmarks share: CUDA error checks, device buffers owned by the bench, bf16 rounding of host
// values, and event timing with an L2-evicting memset before each timed call.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "mxtrain/ops.hpp"

namespace mxt::bench {

inline void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// A device buffer owned by the bench.
struct Buf {
  Ops* ops = nullptr;
  Tensor t;
  Buf(Ops& o, DType d, std::initializer_list<int64_t> dims) : ops(&o) {
    t = Tensor(nullptr, d, dims, Device::CUDA);
    t.data = o.alloc(t.bytes());
  }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  ~Buf() { ops->release(t.data); }
};

// The bf16 bits of v, rounded to nearest even.
inline uint16_t bf16_bits(float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  return static_cast<uint16_t>((b + 0x7FFF + ((b >> 16) & 1)) >> 16);
}

// Uniform random bf16 in [-scale, scale), generated in chunks on the host (splitmix64) and uploaded.
inline void fill_uniform(Ops& ops, const Tensor& t, uint64_t seed, float scale) {
  const int64_t n = t.numel();
  const int64_t chunk = 16 << 20;
  std::vector<uint16_t> h(static_cast<size_t>(std::min(n, chunk)));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t off = 0; off < n; off += chunk) {
    const int64_t m = std::min(chunk, n - off);
    for (int64_t i = 0; i < m; i += 4) {
      s += 0x9E3779B97F4A7C15ull;
      uint64_t z = s;
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      z ^= z >> 31;
      for (int j = 0; j < 4 && i + j < m; ++j) {
        const float u = (static_cast<float>((z >> (16 * j)) & 0xFFFF) / 65536.f * 2.f - 1.f) * scale;
        h[i + j] = bf16_bits(u);
      }
    }
    ops.upload(static_cast<uint16_t*>(t.data) + off, h.data(), static_cast<size_t>(m) * 2);
  }
}

// A benchmark's main(): run(argc, argv), or the exception's message after the benchmark's name and exit status 1.
inline int guarded_main(const char* name, int (*run)(int, char**), int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return 1;
  }
}

// fn run back to back for about `seconds` (synchronising every 10 calls, so the queue stays short), after one
// untimed call: the wall-clock window (epoch seconds) and the calls in it, for sampling the GPU's clock and power
// under one kernel (bench_grouped_gemm --sustain, scripts/gpu_samples.py).
struct Sustained {
  double start = 0, end = 0;
  long calls = 0;
};

inline Sustained sustain(cudaStream_t st, double seconds, const std::function<void()>& fn) {
  using clock = std::chrono::system_clock;
  auto epoch = [](clock::time_point t) { return std::chrono::duration<double>(t.time_since_epoch()).count(); };
  fn();
  ck(cudaStreamSynchronize(st), "sync");
  Sustained r;
  const clock::time_point t0 = clock::now();
  do {
    for (int i = 0; i < 10; ++i) fn();
    r.calls += 10;
    ck(cudaStreamSynchronize(st), "sync");
  } while (std::chrono::duration<double>(clock::now() - t0).count() < seconds);
  r.start = epoch(t0);
  r.end = epoch(clock::now());
  return r;
}

struct Timing {
  double median_ms = 0, min_ms = 0;
};

// Median / min over `runs` timed calls of each of fns, each call after an L2-evicting memset; `warmup` untimed rounds
// first. Each run calls them in its own shuffled order (a fixed seed): timed in blocks, one after the other, the
// first block runs on a cooler GPU at a higher clock under the power cap; interleaved they share the clock and
// temperature. Shuffled, not rotated: in a fixed rotation each call always follows the same one (session 62, H100:
// W2's call that always followed cuBLASLt's measured 2.9% below the experts-by-rows call two places later, which
// session 61 had timed 0.25% from it; shuffled, the two came within 0.3% twice), so none always goes first or always
// follows the same call.
inline std::vector<Timing> time_rotating(cudaStream_t st, void* flush, size_t flush_bytes, int warmup, int runs,
                                         const std::vector<std::function<void()>>& fns) {
  const int n = static_cast<int>(fns.size());
  for (int i = 0; i < warmup; ++i)
    for (const auto& fn : fns) fn();
  std::vector<cudaEvent_t> ev(2 * static_cast<size_t>(n) * runs);  // [run][fn][start, end]
  for (auto& e : ev) ck(cudaEventCreate(&e), "cudaEventCreate");
  std::vector<int> order(n);
  std::mt19937 rng(20261206);
  for (int i = 0; i < runs; ++i) {
    for (int k = 0; k < n; ++k) order[k] = k;
    std::shuffle(order.begin(), order.end(), rng);
    for (int k = 0; k < n; ++k) {
      const int f = order[k];
      ck(cudaMemsetAsync(flush, (n * i + k) & 0xFF, flush_bytes, st), "flush");
      ck(cudaEventRecord(ev[2 * (n * i + f)], st), "event");
      fns[f]();
      ck(cudaEventRecord(ev[2 * (n * i + f) + 1], st), "event");
    }
  }
  ck(cudaStreamSynchronize(st), "sync");
  ck(cudaGetLastError(), "kernels");
  std::vector<Timing> t(n);
  for (int f = 0; f < n; ++f) {
    std::vector<double> ms(runs);
    for (int i = 0; i < runs; ++i) {
      float m = 0;
      ck(cudaEventElapsedTime(&m, ev[2 * (n * i + f)], ev[2 * (n * i + f) + 1]), "elapsed");
      ms[i] = m;
    }
    std::sort(ms.begin(), ms.end());
    t[f] = {ms[runs / 2], ms[0]};
  }
  for (auto& e : ev) cudaEventDestroy(e);
  return t;
}

// One function's median / min (time_rotating of one).
inline Timing time_it(cudaStream_t st, void* flush, size_t flush_bytes, int warmup, int runs,
                      const std::function<void()>& fn) {
  return time_rotating(st, flush, flush_bytes, warmup, runs, {fn})[0];
}

}  // namespace mxt::bench
