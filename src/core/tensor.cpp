#include "mxtrain/tensor.hpp"

#include <sstream>

namespace mxt {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::BF16: return "bf16";
    case DType::I32: return "i32";
    case DType::U8: return "u8";
    case DType::I16: return "i16";
  }
  return "unknown";
}

Tensor::Tensor(void* d, DType t, std::initializer_list<int64_t> dims, Device dev)
    : data(d), dtype(t), device(dev) {
  if (dims.size() > static_cast<size_t>(kMaxDims))
    throw std::invalid_argument("Tensor: at most " + std::to_string(kMaxDims) + " dims, got " +
                                std::to_string(dims.size()));
  for (int64_t x : dims) {
    if (x < 0) throw std::invalid_argument("Tensor: negative dimension " + std::to_string(x));
    shape[ndim++] = x;
  }
}

// A tensor with no dims is the "empty" tensor (optional arguments), so its numel is 0, not 1.
int64_t Tensor::numel() const {
  if (ndim == 0) return 0;
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

int64_t Tensor::dim(int i) const {
  const int j = i < 0 ? ndim + i : i;
  if (j < 0 || j >= ndim)
    throw std::out_of_range("Tensor::dim(" + std::to_string(i) + ") on a tensor of shape " + shape_str());
  return shape[j];
}

std::string Tensor::shape_str() const {
  std::ostringstream os;
  os << '[';
  for (int i = 0; i < ndim; ++i) os << (i ? ", " : "") << shape[i];
  os << ']';
  return os.str();
}

static void expect_dtype(const Tensor& t, DType want, const char* fn) {
  if (t.dtype != want)
    throw std::invalid_argument(std::string("Tensor::") + fn + ": expected dtype " + dtype_name(want) +
                                ", got " + dtype_name(t.dtype) + " (shape " + t.shape_str() + ")");
}

float* Tensor::f32() const {
  expect_dtype(*this, DType::F32, "f32");
  return static_cast<float*>(data);
}

int32_t* Tensor::i32() const {
  expect_dtype(*this, DType::I32, "i32");
  return static_cast<int32_t*>(data);
}

Tensor Tensor::view(std::initializer_list<int64_t> dims) const {
  Tensor v(data, dtype, dims, device);
  if (v.numel() != numel())
    throw std::invalid_argument("Tensor::view: cannot view " + shape_str() + " as " + v.shape_str() +
                                " (numel differs)");
  return v;
}

Tensor Tensor::rows(int64_t r0, int64_t n) const {
  if (ndim < 1) throw std::invalid_argument("Tensor::rows on a tensor with no dims");
  if (r0 < 0 || n < 0 || r0 + n > shape[0])
    throw std::out_of_range("Tensor::rows(" + std::to_string(r0) + ", " + std::to_string(n) +
                            ") out of range for shape " + shape_str());
  Tensor r = *this;
  int64_t row_elems = 1;
  for (int i = 1; i < ndim; ++i) row_elems *= shape[i];
  r.shape[0] = n;
  if (data) r.data = static_cast<char*>(data) + static_cast<size_t>(r0 * row_elems) * dtype_size(dtype);
  return r;
}

}  // namespace mxt
