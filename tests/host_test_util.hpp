#pragma once
// Helpers for the host-side op tests: random vectors without zeros, host tensor views, the message of an
// expected std::invalid_argument.
#include <cstdint>
#include <initializer_list>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "mxtrain/tensor.hpp"
#include "thrown_message.hpp"

namespace mxt::testing {

using FVec = std::vector<float>;
using IVec = std::vector<int32_t>;

// Uniform in [lo, hi), never exactly zero (tests check values, not zeros).
inline FVec uniform(size_t n, std::mt19937& rng, float lo = -1.f, float hi = 1.f) {
  std::uniform_real_distribution<float> d(lo, hi);
  FVec v(n);
  for (auto& x : v) {
    do x = d(rng);
    while (x == 0.f);
  }
  return v;
}

inline Tensor F(FVec& v, std::initializer_list<int64_t> dims) { return Tensor(v.data(), DType::F32, dims); }
inline Tensor I(IVec& v, std::initializer_list<int64_t> dims) { return Tensor(v.data(), DType::I32, dims); }

template <class Fn>
std::string invalid_argument_message(Fn&& f) {
  return thrown_message<std::invalid_argument>(f);
}

}  // namespace mxt::testing
