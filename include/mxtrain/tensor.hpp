#pragma once
// A non-owning view of a buffer on some device. The op interface passes these so one model/trainer
// code path drives both the CPU reference (fp32 host memory) and the CUDA backend (bf16 device memory).
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>

namespace mxt {

enum class DType : uint8_t { F32, BF16, I32, U8, I16 };
enum class Device : uint8_t { CPU, CUDA };

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::I32: return 4;
    case DType::U8: return 1;
    case DType::I16: return 2;
  }
  return 0;
}
const char* dtype_name(DType t);

struct Tensor {
  static constexpr int kMaxDims = 4;
  void* data = nullptr;
  DType dtype = DType::F32;
  Device device = Device::CPU;
  int ndim = 0;
  int64_t shape[kMaxDims] = {0, 0, 0, 0};

  Tensor() = default;
  Tensor(void* d, DType t, std::initializer_list<int64_t> dims, Device dev = Device::CPU);

  int64_t numel() const;
  size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  int64_t dim(int i) const;  // negative i counts from the end
  std::string shape_str() const;

  // Typed host access; throws if the dtype does not match (the CPU backend only handles F32 / I32).
  float* f32() const;
  int32_t* i32() const;
  // Same buffer seen with another shape of equal numel.
  Tensor view(std::initializer_list<int64_t> dims) const;
  // Rows [r0, r0+n) of a tensor whose first dimension is rows.
  Tensor rows(int64_t r0, int64_t n) const;
};

}  // namespace mxt
