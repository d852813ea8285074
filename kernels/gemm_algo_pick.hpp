#pragma once
// MXTRAIN_GEMM_ALGO=k[@d|@K=c]: run cuBLASLt's k-th heuristic algorithm (0 = its first, the default) instead of
// its first, for the GEMMs whose largest of M, N, K is at least d (all without @d; the LM head's GEMMs alone with
// @65536 at a 128,256-token vocabulary), or with @K=c those whose contraction length K is c (the LM head's one
// weight-gradient GEMM per step at 8 micro-batches of 4096 tokens: @K=32768). An experiment's knob: under the
// H200's power cap the fastest algorithm of a short call need not be the one that holds the highest clock (session
// 24's CTA pairs). Host only; parsed once by gemm_cublaslt.cu, tested on the CPU (tests/cuda/test_gemm_algo_pick.cpp).
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace mxt {

struct GemmAlgoPick {
  int index = 0;          // the heuristic's k-th algorithm (the last found where it offers fewer)
  int64_t min_dim = 0;    // for GEMMs with max(M, N, K) >= min_dim
  int64_t only_k = 0;     // > 0: for GEMMs with K == only_k instead
  bool applies(int64_t M, int64_t N, int64_t K) const {
    return index > 0 && (only_k > 0 ? K == only_k : std::max({M, N, K}) >= min_dim);
  }
};

// Parses the variable's value (null or empty: the default); an error naming the variable and the value otherwise.
inline GemmAlgoPick parse_gemm_algo_pick(const char* value) {
  GemmAlgoPick p;
  if (value == nullptr || *value == 0) return p;
  const std::string s = value;
  const auto bad = [&] {
    return std::invalid_argument("MXTRAIN_GEMM_ALGO must be k, k@d or k@K=c (k in 0..15, d, c >= 1), got '" + s +
                                 "'");
  };
  const size_t at = s.find('@');
  const std::string k = s.substr(0, at);
  std::string d = at == std::string::npos ? "" : s.substr(at + 1);
  const bool on_k = d.rfind("K=", 0) == 0;
  if (on_k) d = d.substr(2);
  const auto digits = [](const std::string& t) { return !t.empty() && t.size() <= 10 &&
                                                          t.find_first_not_of("0123456789") == std::string::npos; };
  if (!digits(k) || (at != std::string::npos && !digits(d))) throw bad();
  p.index = std::stoi(k);
  if (p.index > 15) throw bad();
  if (at != std::string::npos) {
    const int64_t v = std::stoll(d);
    if (v < 1) throw bad();
    (on_k ? p.only_k : p.min_dim) = v;
  }
  return p;
}

}  // namespace mxt
