// Host-side F32 views of F32 or BF16 buffers (the AdamW moments under adamw_moments_dtype=bfloat16): checkpoints
// and expert moves work in F32 whatever a buffer holds. Reading BF16 widens exactly; writing into BF16 rounds to
// nearest even.
#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "mxtrain/bf16.hpp"
#include "mxtrain/master_transfer.hpp"
#include "mxtrain/ops.hpp"

namespace mxt {
namespace {
char* element(const Tensor& t, int64_t i) {
  return static_cast<char*>(t.data) + i * static_cast<int64_t>(dtype_size(t.dtype));
}
void expect_f32_or_bf16(const Tensor& t, const char* what) {
  if (t.dtype != DType::F32 && t.dtype != DType::BF16)
    throw std::invalid_argument(std::string(what) + ": an F32 or BF16 buffer expected, got " + dtype_name(t.dtype));
}
}  // namespace

void download_f32(Ops& ops, const Tensor& t, int64_t from, int64_t n, float* dst) {
  expect_f32_or_bf16(t, "download_f32");
  if (n <= 0) return;
  if (t.dtype == DType::F32) {
    ops.download(dst, element(t, from), static_cast<size_t>(n) * sizeof(float));
    return;
  }
  std::vector<uint16_t> bits(static_cast<size_t>(n));
  ops.download(bits.data(), element(t, from), bits.size() * sizeof(uint16_t));
  for (size_t i = 0; i < bits.size(); ++i) dst[i] = bf16_bits_to_f32(bits[i]);
}

void upload_f32(Ops& ops, const Tensor& t, int64_t from, int64_t n, const float* src) {
  expect_f32_or_bf16(t, "upload_f32");
  if (n <= 0) return;
  if (t.dtype == DType::F32) {
    ops.upload(element(t, from), src, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  std::vector<uint16_t> bits(static_cast<size_t>(n));
  for (size_t i = 0; i < bits.size(); ++i) bits[i] = f32_to_bf16_bits(src[i]);
  ops.upload(element(t, from), bits.data(), bits.size() * sizeof(uint16_t));
}

namespace {
// Calls f(at, k, hi, rem) for each chunk [at, at + k) of n elements, with host buffers of k halves: a split master
// is joined or split on the host in bounded pieces (8x7B masters are billions of elements).
template <typename F>
void for_split_chunks(int64_t n, F&& f) {
  constexpr int64_t kChunk = int64_t{1} << 24;
  std::vector<uint16_t> hi;
  std::vector<int16_t> rem;
  for (int64_t at = 0; at < n; at += kChunk) {
    const size_t k = static_cast<size_t>(std::min(kChunk, n - at));
    hi.resize(k);
    rem.resize(k);
    f(at, k, hi.data(), rem.data());
  }
}
}  // namespace

void download_joined(Ops& ops, const void* hi, const void* rem, int64_t from, int64_t n, float* dst) {
  for_split_chunks(n, [&](int64_t at, size_t k, uint16_t* h, int16_t* r) {
    ops.download(h, static_cast<const uint16_t*>(hi) + from + at, k * 2);
    ops.download(r, static_cast<const int16_t*>(rem) + from + at, k * 2);
    for (size_t i = 0; i < k; ++i) dst[at + static_cast<int64_t>(i)] = join_master(h[i], r[i]);
  });
}

void upload_split(Ops& ops, void* hi, void* rem, int64_t from, int64_t n, const float* src) {
  for_split_chunks(n, [&](int64_t at, size_t k, uint16_t* h, int16_t* r) {
    for (size_t i = 0; i < k; ++i) split_master(src[at + static_cast<int64_t>(i)], h[i], r[i]);
    ops.upload(static_cast<uint16_t*>(hi) + from + at, h, k * 2);
    ops.upload(static_cast<int16_t*>(rem) + from + at, r, k * 2);
  });
}

}  // namespace mxt
