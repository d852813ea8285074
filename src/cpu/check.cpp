#include "cpu/check.hpp"

#include <stdexcept>

namespace mxt::cpu {

void fail(const char* op, const std::string& msg) {
  throw std::invalid_argument(std::string(op) + ": " + msg);
}

static void* host_data(const Tensor& t, DType want, const char* op, const char* arg) {
  if (t.dtype != want)
    fail(op, std::string(arg) + " must be " + dtype_name(want) + ", got " + dtype_name(t.dtype) +
                 " (the CPU backend handles f32 data and i32 indices only)");
  if (t.device != Device::CPU) fail(op, std::string(arg) + " is not a CPU tensor");
  if (!t.data && t.numel() > 0) fail(op, std::string(arg) + " has no data");
  return t.data;
}

float* f32(const Tensor& t, const char* op, const char* arg) {
  return static_cast<float*>(host_data(t, DType::F32, op, arg));
}

uint16_t* bf16(const Tensor& t, const char* op, const char* arg) {
  return static_cast<uint16_t*>(host_data(t, DType::BF16, op, arg));
}

int32_t* i32(const Tensor& t, const char* op, const char* arg) {
  return static_cast<int32_t*>(host_data(t, DType::I32, op, arg));
}

void expect_2d(const Tensor& t, int64_t rows, int64_t cols, const char* op, const char* arg) {
  const int64_t lead = t.ndim ? t.shape[0] : 0;
  if (lead != rows || t.numel() != rows * cols)
    fail(op, std::string(arg) + " has shape " + t.shape_str() + ", expected " + std::to_string(rows) +
                 " rows of " + std::to_string(cols) + " elements");
}

void expect_numel(const Tensor& t, int64_t n, const char* op, const char* arg) {
  if (t.numel() != n)
    fail(op, std::string(arg) + " has shape " + t.shape_str() + ", expected " + std::to_string(n) +
                 " elements");
}

const int32_t* expert_offsets(const Tensor& offsets, int64_t E, int64_t rows, const char* op) {
  expect_numel(offsets, E + 1, op, "offsets");
  const int32_t* off = i32(offsets, op, "offsets");
  if (off[0] != 0) fail(op, "offsets[0] must be 0, got " + std::to_string(off[0]));
  for (int64_t e = 0; e < E; ++e)
    if (off[e + 1] < off[e]) fail(op, "offsets decrease at expert " + std::to_string(e));
  if (off[E] > rows)
    fail(op, "offsets[E] = " + std::to_string(off[E]) + " exceeds the " + std::to_string(rows) + " rows");
  return off;
}

}  // namespace mxt::cpu
