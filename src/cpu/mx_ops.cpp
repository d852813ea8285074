// CPU twins of the MXFP8 ops: the bit-exact quantiser (mxfp8::quantize), then GEMMs on the dequantised
// operands through OpenBLAS. Dequantisation is exact, so this differs from an MX tensor-core GEMM only in
// fp32 summation order; it keeps L0-size CPU runs fast (the fp64 mxfp8::gemm_ref is the kernels' oracle).
#include <algorithm>
#include <vector>

#include "cpu/check.hpp"
#include "cpu/cpu_ops.hpp"
#include "mxtrain/mxfp8.hpp"

namespace mxt {

namespace {

using mxfp8::MxView;

void check_view(const MxView& v, const char* op, const char* arg) {
  mxfp8::check_shape(v.batch, v.rows, v.cols, v.dir, op);
  if (v.device != Device::CPU) cpu::fail(op, std::string(arg) + " is not a CPU MXFP8 view");
  if (v.data_bytes() > 0 && (!v.data || !v.scales)) cpu::fail(op, std::string(arg) + " has no buffers");
}

// The K-major operand [batch][op_rows][op_k] as fp32. Both directions store their codes in exactly that
// order with one scale per 32 consecutive codes, so this is one linear pass.
std::vector<float> dequantize_operand(const MxView& v) {
  float lut[256];
  for (int q = 0; q < 256; ++q) lut[q] = mxfp8::decode(static_cast<uint8_t>(q), v.format);
  const int64_t n = v.data_bytes();
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t b = 0; b < n / mxfp8::kBlock; ++b) {
    const float s = mxfp8::scale_value(v.scales[b]);  // NaN for 0xFF: the whole block is NaN
    for (int j = 0; j < mxfp8::kBlock; ++j) {
      const int64_t i = b * mxfp8::kBlock + j;
      out[i] = lut[v.data[i]] * s;
    }
  }
  return out;
}

void check_k(const MxView& A, const MxView& B, const char* op) {
  if (A.op_k() != B.op_k())
    cpu::fail(op, "contraction dims differ: A has K=" + std::to_string(A.op_k()) + ", B has K=" +
                      std::to_string(B.op_k()));
}

}  // namespace

void CpuOps::mx_quantize(const Tensor& x, const MxView* rowwise, const MxView* colwise) {
  const char* op = "mx_quantize";
  if (x.ndim != 2 && x.ndim != 3) cpu::fail(op, "x must be [rows, cols] or [batch, rows, cols], got " + x.shape_str());
  const int64_t batch = x.ndim == 3 ? x.shape[0] : 1;
  mxfp8::quantize(cpu::f32(x, op, "x"), batch, x.dim(-2), x.dim(-1), rowwise, colwise);
}

void CpuOps::mx_dequantize(const MxView& q, const Tensor& out) {
  const char* op = "mx_dequantize";
  check_view(q, op, "q");
  if (out.numel() != q.data_bytes())
    cpu::fail(op, "out must hold the copy's " + std::to_string(q.data_bytes()) + " values, got " + out.shape_str());
  const std::vector<float> v = mxfp8::dequantize(q);  // the logical layout, either direction
  std::copy(v.begin(), v.end(), cpu::f32(out, op, "out"));
}

void CpuOps::mx_quantize_values(const Tensor& x, mxfp8::Format row_format, const Tensor& row_values,
                                const MxView* colwise) {
  const char* op = "mx_quantize_values";
  if (x.ndim != 2 && x.ndim != 3) cpu::fail(op, "x must be [rows, cols] or [batch, rows, cols], got " + x.shape_str());
  const int64_t batch = x.ndim == 3 ? x.shape[0] : 1;
  if (row_values.numel() != x.numel())
    cpu::fail(op, "row_values must hold x's " + std::to_string(x.numel()) + " values, got " + row_values.shape_str());
  mxfp8::MxHost row(batch, x.dim(-2), x.dim(-1), row_format, mxfp8::Direction::Rowwise);
  const MxView rv = row.view();
  mxfp8::quantize(cpu::f32(x, op, "x"), batch, x.dim(-2), x.dim(-1), &rv, colwise);
  const std::vector<float> v = mxfp8::dequantize(rv);
  std::copy(v.begin(), v.end(), cpu::f32(row_values, op, "row_values"));
}

void CpuOps::mx_grouped_gemm(const MxView& A, const MxView& B, const Tensor& offsets, const Tensor& C) {
  const char* op = "mx_grouped_gemm";
  check_view(A, op, "A");
  check_view(B, op, "B");
  check_k(A, B, op);
  if (A.batch != 1) cpu::fail(op, "A must have batch 1");
  const int64_t M = A.op_rows(), N = B.op_rows(), K = A.op_k(), E = B.batch;
  const int32_t* off = cpu::expert_offsets(offsets, E, M, op);
  cpu::expect_2d(C, M, N, op, "C");
  float* c = cpu::f32(C, op, "C");
  const std::vector<float> a = dequantize_operand(A), b = dequantize_operand(B);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = off[e], n = off[e + 1] - r0;
    cpu::sgemm(false, true, n, N, K, 1.f, a.data() + r0 * K, K, b.data() + e * N * K, K, 0.f, c + r0 * N, N, op);
  }
  for (int64_t i = off[E] * N; i < M * N; ++i) c[i] = 0.f;  // capacity rows
}

void CpuOps::mx_grouped_gemm_wgrad(const MxView& A, const MxView& B, const Tensor& offsets, const Tensor& C) {
  const char* op = "mx_grouped_gemm_wgrad";
  check_view(A, op, "A");
  check_view(B, op, "B");
  check_k(A, B, op);
  if (A.batch != 1 || B.batch != 1) cpu::fail(op, "A and B must have batch 1");
  const int64_t M = A.op_rows(), N = B.op_rows(), K = A.op_k();
  if (offsets.ndim != 1 || offsets.shape[0] < 2) cpu::fail(op, "offsets must be [E+1] with E >= 1");
  const int64_t E = offsets.shape[0] - 1;
  const int32_t* off = cpu::expert_offsets(offsets, E, K, op);
  if (C.numel() != E * M * N)
    cpu::fail(op, "C must be [" + std::to_string(E) + ", " + std::to_string(M) + ", " + std::to_string(N) +
                      "], got " + C.shape_str());
  float* c = cpu::f32(C, op, "C");
  const std::vector<float> a = dequantize_operand(A), b = dequantize_operand(B);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t k0 = off[e], n = off[e + 1] - k0;
    if (n == 0) continue;  // nothing to add (K = 0 would rescale by beta)
    cpu::sgemm(false, true, M, N, n, 1.f, a.data() + k0, K, b.data() + k0, K, 1.f, c + e * M * N, N, op);
  }
}

}  // namespace mxt
