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

constexpr int64_t kSplitChunk = int64_t{1} << 24;  // elements joined or split per host buffer

void download_joined(Ops& ops, const void* hi, const void* rem, int64_t from, int64_t n, float* dst) {
  std::vector<uint16_t> h;
  std::vector<int16_t> r;
  for (int64_t at = 0; at < n; at += kSplitChunk) {
    const size_t k = static_cast<size_t>(std::min(kSplitChunk, n - at));
    h.resize(k);
    r.resize(k);
    ops.download(h.data(), static_cast<const uint16_t*>(hi) + from + at, k * 2);
    ops.download(r.data(), static_cast<const int16_t*>(rem) + from + at, k * 2);
    for (size_t i = 0; i < k; ++i) dst[at + static_cast<int64_t>(i)] = join_master(h[i], r[i]);
  }
}

void upload_split(Ops& ops, void* hi, void* rem, int64_t from, int64_t n, const float* src) {
  std::vector<uint16_t> h;
  std::vector<int16_t> r;
  for (int64_t at = 0; at < n; at += kSplitChunk) {
    const size_t k = static_cast<size_t>(std::min(kSplitChunk, n - at));
    h.resize(k);
    r.resize(k);
    for (size_t i = 0; i < k; ++i) split_master(src[at + static_cast<int64_t>(i)], h[i], r[i]);
    ops.upload(static_cast<uint16_t*>(hi) + from + at, h.data(), k * 2);
    ops.upload(static_cast<int16_t*>(rem) + from + at, r.data(), k * 2);
  }
}

}  // namespace mxt
