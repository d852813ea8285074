// XXH64, streaming (the algorithm as published by its author; written here from the specification).
// Four independent lanes over 32-byte stripes keep it near memory bandwidth, so checking every byte of a
// checkpoint costs little next to the disk.
#include <cstring>

#include <fmt/format.h>

#include "ckpt/ckpt_internal.hpp"

namespace mxt::ckpt {
namespace {

constexpr uint64_t P1 = 0x9E3779B185EBCA87ull, P2 = 0xC2B2AE3D27D4EB4Full, P3 = 0x165667B19E3779F9ull,
                   P4 = 0x85EBCA77C2B2AE63ull, P5 = 0x27D4EB2F165667C5ull;

inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
inline uint64_t load64(const unsigned char* p) {  // little-endian hosts only (checked by the shard writer)
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
inline uint32_t load32(const unsigned char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline uint64_t round(uint64_t acc, uint64_t in) { return rotl(acc + in * P2, 31) * P1; }
inline uint64_t merge(uint64_t h, uint64_t v) { return (h ^ round(0, v)) * P1 + P4; }

}  // namespace

Hasher64::Hasher64(uint64_t seed) : seed_(seed), v_{seed + P1 + P2, seed + P2, seed, seed - P1} {}

void Hasher64::update(const void* data, size_t n) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  total_ += n;
  if (buf_len_ + n < 32) {
    std::memcpy(buf_ + buf_len_, p, n);
    buf_len_ += n;
    return;
  }
  if (buf_len_ > 0) {  // complete the buffered stripe
    const size_t take = 32 - buf_len_;
    std::memcpy(buf_ + buf_len_, p, take);
    for (int k = 0; k < 4; ++k) v_[k] = round(v_[k], load64(buf_ + 8 * k));
    p += take;
    n -= take;
    buf_len_ = 0;
  }
  uint64_t a = v_[0], b = v_[1], c = v_[2], d = v_[3];
  for (; n >= 32; p += 32, n -= 32) {
    a = round(a, load64(p));
    b = round(b, load64(p + 8));
    c = round(c, load64(p + 16));
    d = round(d, load64(p + 24));
  }
  v_[0] = a, v_[1] = b, v_[2] = c, v_[3] = d;
  std::memcpy(buf_, p, n);
  buf_len_ = n;
}

uint64_t Hasher64::digest() const {
  uint64_t h;
  if (total_ >= 32) {
    h = rotl(v_[0], 1) + rotl(v_[1], 7) + rotl(v_[2], 12) + rotl(v_[3], 18);
    for (int k = 0; k < 4; ++k) h = merge(h, v_[k]);
  } else {
    h = seed_ + P5;
  }
  h += total_;
  const unsigned char* p = buf_;
  size_t n = buf_len_;
  for (; n >= 8; p += 8, n -= 8) h = rotl(h ^ round(0, load64(p)), 27) * P1 + P4;
  if (n >= 4) {
    h = rotl(h ^ (static_cast<uint64_t>(load32(p)) * P1), 23) * P2 + P3;
    p += 4;
    n -= 4;
  }
  for (; n > 0; ++p, --n) h = rotl(h ^ (*p * P5), 11) * P1;
  h ^= h >> 33;
  h *= P2;
  h ^= h >> 29;
  h *= P3;
  h ^= h >> 32;
  return h;
}

uint64_t hash64(const void* data, size_t n) {
  Hasher64 h;
  h.update(data, n);
  return h.digest();
}

std::string hex64(uint64_t h) { return fmt::format("{:016x}", h); }

}  // namespace mxt::ckpt
