#pragma once
// Helpers for the host-side op tests: random vectors without zeros, host tensor views, the message of an
// expected std::invalid_argument.
#include <cmath>
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

// ||got - ref|| / ||ref||.
inline double rel_l2(const std::vector<float>& got, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += (double(got[i]) - ref[i]) * (double(got[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / (den > 0 ? den : 1e-30));
}

inline Tensor F(FVec& v, std::initializer_list<int64_t> dims) { return Tensor(v.data(), DType::F32, dims); }
inline Tensor I(IVec& v, std::initializer_list<int64_t> dims) { return Tensor(v.data(), DType::I32, dims); }

template <class Fn>
std::string invalid_argument_message(Fn&& f) {
  return thrown_message<std::invalid_argument>(f);
}

}  // namespace mxt::testing
