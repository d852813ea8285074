// MXFP8 GEMM references: dequantise both K-major operands (exact, see mxfp8.hpp) and multiply in fp64. The
// oracle for the MXFP8 grouped GEMM kernels.
#include <stdexcept>
#include <string>

#include "mxtrain/mxfp8.hpp"

namespace mxt::mxfp8 {

namespace {

// Batch entry b of a K-major operand as fp64 [op_rows][op_k].
std::vector<double> operand(const MxView& v, int64_t b, const char* op, const char* arg) {
  check_shape(v.batch, v.rows, v.cols, v.dir, op);
  if (v.device != Device::CPU) throw std::invalid_argument(std::string(op) + ": " + arg + " is not a CPU view");
  if (b < 0 || b >= v.batch)
    throw std::invalid_argument(std::string(op) + ": " + arg + " has no batch entry " + std::to_string(b));
  const int64_t R = v.op_rows(), K = v.op_k();
  std::vector<double> out(static_cast<size_t>(R * K));
  const bool row = v.dir == Direction::Rowwise;
  for (int64_t i = 0; i < R; ++i)
    for (int64_t k = 0; k < K; ++k) out[i * K + k] = row ? dequantize_at(v, b, i, k) : dequantize_at(v, b, k, i);
  return out;
}

void check_k(const MxView& A, const MxView& B, const char* op) {
  if (A.op_k() != B.op_k())
    throw std::invalid_argument(std::string(op) + ": contraction dims differ: A has K=" + std::to_string(A.op_k()) +
                                ", B has K=" + std::to_string(B.op_k()));
}

void check_offsets(const std::vector<int32_t>& off, int64_t groups, int64_t extent, const char* op) {
  if (static_cast<int64_t>(off.size()) != groups + 1)
    throw std::invalid_argument(std::string(op) + ": offsets has " + std::to_string(off.size()) +
                                " entries, expected " + std::to_string(groups + 1));
  if (off[0] != 0) throw std::invalid_argument(std::string(op) + ": offsets[0] must be 0");
  for (int64_t e = 0; e < groups; ++e)
    if (off[e + 1] < off[e]) throw std::invalid_argument(std::string(op) + ": offsets must be non-decreasing");
  if (off[groups] > extent)
    throw std::invalid_argument(std::string(op) + ": offsets end at " + std::to_string(off[groups]) + " > " +
                                std::to_string(extent));
}

}  // namespace

std::vector<double> gemm_ref(const MxView& A, int64_t ab, const MxView& B, int64_t bb) {
  const char* op = "mxfp8::gemm_ref";
  check_k(A, B, op);
  const std::vector<double> a = operand(A, ab, op, "A"), b = operand(B, bb, op, "B");
  const int64_t M = A.op_rows(), N = B.op_rows(), K = A.op_k();
  std::vector<double> c(static_cast<size_t>(M * N), 0.0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += a[m * K + k] * b[n * K + k];
      c[m * N + n] = s;
    }
  return c;
}

std::vector<double> grouped_gemm_ref(const MxView& A, const MxView& B, const std::vector<int32_t>& off) {
  const char* op = "mxfp8::grouped_gemm_ref";
  check_k(A, B, op);
  if (A.batch != 1) throw std::invalid_argument(std::string(op) + ": A must have batch 1");
  const int64_t M = A.op_rows(), N = B.op_rows(), K = A.op_k(), E = B.batch;
  check_offsets(off, E, M, op);
  const std::vector<double> a = operand(A, 0, op, "A");
  std::vector<double> c(static_cast<size_t>(M * N), 0.0);
  for (int64_t e = 0; e < E; ++e) {
    if (off[e + 1] == off[e]) continue;
    const std::vector<double> b = operand(B, e, op, "B");
    for (int64_t m = off[e]; m < off[e + 1]; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k) s += a[m * K + k] * b[n * K + k];
        c[m * N + n] = s;
      }
  }
  return c;
}

std::vector<double> grouped_gemm_wgrad_ref(const MxView& A, const MxView& B, const std::vector<int32_t>& off) {
  const char* op = "mxfp8::grouped_gemm_wgrad_ref";
  check_k(A, B, op);
  if (A.batch != 1 || B.batch != 1) throw std::invalid_argument(std::string(op) + ": A and B must have batch 1");
  const int64_t M = A.op_rows(), N = B.op_rows(), K = A.op_k();
  const int64_t E = static_cast<int64_t>(off.size()) - 1;
  if (E < 1) throw std::invalid_argument(std::string(op) + ": offsets needs at least 2 entries");
  check_offsets(off, E, K, op);
  const std::vector<double> a = operand(A, 0, op, "A"), b = operand(B, 0, op, "B");
  std::vector<double> c(static_cast<size_t>(E * M * N), 0.0);
  for (int64_t e = 0; e < E; ++e)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double s = 0;
        for (int64_t k = off[e]; k < off[e + 1]; ++k) s += a[m * K + k] * b[n * K + k];
        c[(e * M + m) * N + n] = s;
      }
  return c;
}

}  // namespace mxt::mxfp8
