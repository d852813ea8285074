// Memory and elementwise ops of the CPU backend, and its factory.
#include "cpu/cpu_ops.hpp"

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <new>

#include "cpu/check.hpp"
#include "mxtrain/bf16.hpp"

namespace mxt {

using cpu::fail;

std::unique_ptr<Ops> make_cpu_ops() { return std::make_unique<CpuOps>(); }

// 64-byte alignment keeps SIMD loads and OpenBLAS happy; a 0-byte request still yields a real pointer.
void* CpuOps::alloc(size_t bytes) {
  const size_t n = (bytes + 63) / 64 * 64 + (bytes == 0 ? 64 : 0);
  void* p = std::aligned_alloc(64, n);
  if (!p) throw std::bad_alloc();
  std::memset(p, 0, n);
  return p;
}

void CpuOps::release(void* p) { std::free(p); }

void CpuOps::upload(void* dst, const void* host_src, size_t bytes) {
  if (bytes) std::memcpy(dst, host_src, bytes);
}

void CpuOps::download(void* host_dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(host_dst, src, bytes);
}

size_t CpuOps::device_free_bytes() const {
  std::ifstream f("/proc/meminfo");
  std::string key;
  size_t kib = 0;
  std::string unit;
  while (f >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return 0;  // unknown: no check
}

void CpuOps::zero(const Tensor& t) {
  if (t.device != Device::CPU) fail("zero", "not a CPU tensor");
  if (t.numel()) std::memset(t.data, 0, t.bytes());
}

void CpuOps::copy(const Tensor& src, const Tensor& dst) {
  if (src.device != Device::CPU || dst.device != Device::CPU) fail("copy", "not a CPU tensor");
  if (src.numel() != dst.numel())
    fail("copy", "numel differs: src " + src.shape_str() + ", dst " + dst.shape_str());
  const int64_t n = src.numel();
  if (n == 0) return;
  if (src.dtype == dst.dtype) {
    std::memmove(dst.data, src.data, src.bytes());
  } else if (src.dtype == DType::BF16 && dst.dtype == DType::F32) {
    const auto* s = static_cast<const uint16_t*>(src.data);
    float* d = static_cast<float*>(dst.data);
    for (int64_t i = 0; i < n; ++i) d[i] = bf16_bits_to_f32(s[i]);
  } else if (src.dtype == DType::F32 && dst.dtype == DType::BF16) {
    const float* s = static_cast<const float*>(src.data);
    auto* d = static_cast<uint16_t*>(dst.data);
    for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16_bits(s[i]);
  } else {
    fail("copy", std::string("unsupported conversion ") + dtype_name(src.dtype) + " -> " +
                     dtype_name(dst.dtype));
  }
}

static void binary_check(const char* op, const Tensor& a, const Tensor& b, const Tensor& out) {
  if (a.numel() != b.numel() || a.numel() != out.numel())
    fail(op, "numel differs: a " + a.shape_str() + ", b " + b.shape_str() + ", out " + out.shape_str());
}

void CpuOps::add(const Tensor& a, const Tensor& b, const Tensor& out) {
  binary_check("add", a, b, out);
  const float* x = cpu::f32(a, "add", "a");
  const float* y = cpu::f32(b, "add", "b");
  float* o = cpu::f32(out, "add", "out");
  for (int64_t i = 0, n = a.numel(); i < n; ++i) o[i] = x[i] + y[i];
}

void CpuOps::mul(const Tensor& a, const Tensor& b, const Tensor& out) {
  binary_check("mul", a, b, out);
  const float* x = cpu::f32(a, "mul", "a");
  const float* y = cpu::f32(b, "mul", "b");
  float* o = cpu::f32(out, "mul", "out");
  for (int64_t i = 0, n = a.numel(); i < n; ++i) o[i] = x[i] * y[i];
}

void CpuOps::scale(const Tensor& t, float s) {
  float* x = cpu::f32(t, "scale", "t");
  for (int64_t i = 0, n = t.numel(); i < n; ++i) x[i] *= s;
}

void CpuOps::sum_squares(const Tensor& t, const Tensor& acc) {
  const float* x = cpu::f32(t, "sum_squares", "t");
  float* a = cpu::f32(acc, "sum_squares", "acc");
  if (acc.numel() < 1) fail("sum_squares", "acc is empty");
  double s = 0.0;
  for (int64_t i = 0, n = t.numel(); i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  a[0] = static_cast<float>(a[0] + s);
}

}  // namespace mxt
