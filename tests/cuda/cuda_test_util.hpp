#pragma once
// Helpers for CUDA-vs-CPU-twin tests: device tensors from host data (rounded to bf16 where the CUDA dtype is
// bf16, and the CPU twin gets the same rounded values), results back as floats, error metrics.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda_ops.hpp"
#include "host_test_util.hpp"
#include "mxtrain/bf16.hpp"
#include "mxtrain/device_info.hpp"
#include "mxtrain/ops.hpp"

namespace mxt::testing {

// Sets an environment variable for one scope (for the op switches read at every call: the attention dispatch,
// MXTRAIN_CE_ROWS).
struct ScopedEnv {
  std::string key, old;
  bool had = false;
  ScopedEnv(const char* k, const char* v) : key(k) {
    if (const char* o = std::getenv(k)) had = true, old = o;
    setenv(k, v, 1);
  }
  ~ScopedEnv() {
    if (had) setenv(key.c_str(), old.c_str(), 1);
    else unsetenv(key.c_str());
  }
};

#define MXT_REQUIRE_GPU()                                                        \
  do {                                                                           \
    if (::mxt::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: skipped"; \
  } while (0)

// Whether the current device is an sm_90 (Hopper) GPU, where the TMA + wgmma kernels apply.
inline bool device_is_sm90() {
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  return major == 9 && minor == 0;
}

#define MXT_REQUIRE_SM90()                                                                                   \
  do {                                                                                                       \
    MXT_REQUIRE_GPU();                                                                                       \
    if (!::mxt::testing::device_is_sm90()) GTEST_SKIP() << "not an sm_90 GPU: the Hopper kernels do not apply"; \
  } while (0)

using mxt::bf16_bits_to_f32;  // mxtrain/bf16.hpp: the host conversions, bit for bit the device's
using mxt::f32_to_bf16_bits;
inline float round_bf16(float f) { return round_to_bf16(f); }
inline void round_bf16(std::vector<float>& v) {
  for (auto& x : v) x = round_bf16(x);
}

// Distance in bf16 units in the last place between two bf16-representable floats of equal sign.
inline int bf16_ulps(float a, float b) {
  const int ia = f32_to_bf16_bits(a), ib = f32_to_bf16_bits(b);
  if (((ia ^ ib) & 0x8000) && !(a == 0.f && b == 0.f)) return 1 << 16;  // different signs: count as far
  return std::abs(ia - ib);
}

inline std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Owns one device buffer; .t is the tensor view.
struct DeviceTensor {
  Ops* ops = nullptr;
  Tensor t;
  DeviceTensor() = default;
  DeviceTensor(Ops& o, DType dtype, std::initializer_list<int64_t> dims) : ops(&o) {
    t = Tensor(nullptr, dtype, dims, Device::CUDA);
    t.data = o.alloc(t.bytes());
  }
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;
  DeviceTensor(DeviceTensor&& o) noexcept : ops(o.ops), t(o.t) { o.t.data = nullptr; }
  ~DeviceTensor() {
    if (ops && t.data) ops->release(t.data);
  }
  operator const Tensor&() const { return t; }
};

// Uploads host floats as dtype (F32 / BF16) or ints as I32.
inline DeviceTensor upload(Ops& o, const std::vector<float>& host, DType dtype, std::initializer_list<int64_t> dims) {
  DeviceTensor d(o, dtype, dims);
  if (static_cast<int64_t>(host.size()) != d.t.numel()) throw std::invalid_argument("upload: size mismatch");
  if (dtype == DType::F32) {
    o.upload(d.t.data, host.data(), host.size() * 4);
  } else if (dtype == DType::BF16) {
    std::vector<uint16_t> b(host.size());
    for (size_t i = 0; i < host.size(); ++i) b[i] = f32_to_bf16_bits(host[i]);
    o.upload(d.t.data, b.data(), b.size() * 2);
  } else {
    throw std::invalid_argument("upload: use upload_i32 for ints");
  }
  return d;
}
inline DeviceTensor upload_i32(Ops& o, const std::vector<int32_t>& host, std::initializer_list<int64_t> dims) {
  DeviceTensor d(o, DType::I32, dims);
  o.upload(d.t.data, host.data(), host.size() * 4);
  return d;
}
inline std::vector<float> download(Ops& o, const Tensor& t) {
  std::vector<float> out(t.numel());
  if (t.dtype == DType::F32) {
    o.download(out.data(), t.data, out.size() * 4);
  } else if (t.dtype == DType::BF16) {
    std::vector<uint16_t> b(out.size());
    o.download(b.data(), t.data, b.size() * 2);
    for (size_t i = 0; i < b.size(); ++i) out[i] = bf16_bits_to_f32(b[i]);
  } else {
    throw std::invalid_argument("download: float tensors only");
  }
  return out;
}
inline std::vector<int32_t> download_i32(Ops& o, const Tensor& t) {
  std::vector<int32_t> out(t.numel());
  o.download(out.data(), t.data, out.size() * 4);
  return out;
}

// Host tensor view over a vector (for the CPU twin).
inline Tensor host(std::vector<float>& v, std::initializer_list<int64_t> dims) {
  return Tensor(v.data(), DType::F32, dims);
}
inline Tensor host_i32(std::vector<int32_t>& v, std::initializer_list<int64_t> dims) {
  return Tensor(v.data(), DType::I32, dims);
}

// rel_l2 (host_test_util.hpp): the global measure for bf16 results; and the worst element.
inline double max_abs_diff(const std::vector<float>& got, const std::vector<float>& ref) {
  double m = 0;
  for (size_t i = 0; i < ref.size(); ++i) m = std::max(m, std::abs(double(got[i]) - ref[i]));
  return m;
}

#define EXPECT_CLOSE_REL(got, ref, tol)                                                     \
  do {                                                                                      \
    ASSERT_EQ((got).size(), (ref).size());                                                  \
    const double _r = ::mxt::testing::rel_l2(got, ref);                                     \
    EXPECT_LT(_r, tol) << #got " vs " #ref ": relative L2 error " << _r;                    \
    EXPECT_TRUE(std::isfinite(_r));                                                         \
  } while (0)

}  // namespace mxt::testing
