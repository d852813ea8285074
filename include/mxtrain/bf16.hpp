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

}  // namespace mxt
