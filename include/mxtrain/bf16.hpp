#pragma once
// bf16 <-> fp32 on the host, bit for bit as the CUDA conversions: bf16 is the upper half of an fp32, and the
// narrowing rounds to nearest even (a NaN stays a quiet NaN).
#include <cstdint>
#include <cstring>

namespace mxt {

inline float bf16_bits_to_f32(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t f32_to_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// The nearest bf16 value, as an fp32.
inline float round_to_bf16(float f) { return bf16_bits_to_f32(f32_to_bf16_bits(f)); }

// optimizer_store_param_remainders (Transformer Engine FusedAdam's form): an fp32 master weight held as a bf16 (its
// upper half, rounded half away from zero: the working copy the model reads) and the lower half as a signed 16-bit
// remainder, from which join_master gives the fp32 bits back exactly. The bf16 differs from round-to-nearest-even
// only on an exact tie (lower half 0x8000), where it rounds away from zero. The device twin: kernels/adamw.cu.
inline void split_master(float f, uint16_t& hi, int16_t& rem) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t lo = static_cast<uint16_t>(u & 0xffffu);
  std::memcpy(&rem, &lo, 2);
  hi = static_cast<uint16_t>((u >> 16) + (rem < 0 ? 1u : 0u));
}

inline float join_master(uint16_t hi, int16_t rem) {
  uint16_t lo;
  std::memcpy(&lo, &rem, 2);
  const uint32_t u = (static_cast<uint32_t>(static_cast<uint16_t>(hi - (rem < 0 ? 1 : 0))) << 16) | lo;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace mxt
