// CUDA MXFP8 grouped GEMMs against the fp64 reference of the same quantised operands (mxfp8::grouped_gemm_ref,
// grouped_gemm_wgrad_ref): forward, dgrad and wgrad with mxfp8.md's operand copies, E4M3 and HYBRID (E5M2
// gradients), uneven and empty experts, capacity-padding rows, ragged wgrad groups, partial tiles and stages.
//
// Tolerance, per element, with S = sum_k |a_k b_k| (the reference on sign-stripped operands):
//   |got - ref| <= 2^-12 S              fp32 outputs (wgrad): the tensor core's internal accumulation of each
//                                       32-product step (about 2^-14 S per step on Hopper, DeepSeek-V3 sec. 3.3)
//                                       and fp32 accumulation across steps, with margin;
//   |got - ref| <= 2^-8 |ref| + 2^-12 S bf16 outputs: plus bf16 rounding (2^-9 relative) with margin.
// A wrong scale, a wrong K pairing or a wrong expert is off by O(S), far outside these.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.hpp"
#include "mxfp8_cuda.hpp"
#include "mxfp8_test_util.hpp"
#include "mxtrain/mxfp8.hpp"

namespace mxt::testing {
namespace {

using mxfp8::Direction;
using mxfp8::Format;
using mxfp8::MxHost;

CudaOps& cuda_of(Ops& o) { return dynamic_cast<CudaOps&>(o); }

// Values with per-element magnitudes over +-3 binades, so block scales differ from block to block.
std::vector<float> random_values(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d;
  std::uniform_real_distribution<float> ex(-3.f, 3.f);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = d(rng) * std::exp2(ex(rng));
  return x;
}

MxHost quantise(const std::vector<float>& x, int64_t batch, int64_t rows, int64_t cols, Format f, Direction d) {
  MxHost h(batch, rows, cols, f, d);
  mxfp8::MxView v = h.view();
  mxfp8::quantize(x.data(), batch, rows, cols, d == Direction::Rowwise ? &v : nullptr,
                  d == Direction::Columnwise ? &v : nullptr);
  return h;
}

// The same copy with every sign bit cleared (|values|; no NaNs in these tests).
MxHost abs_copy(MxHost h) {
  for (auto& b : h.data) b &= 0x7F;
  return h;
}

// Checks got against ref elementwise (both NaN counts as equal); prints the worst error relative to S.
void expect_close(const std::vector<float>& got, const std::vector<double>& ref, const std::vector<double>& S,
                  bool bf16_out, const char* what) {
  ASSERT_EQ(got.size(), ref.size());
  double worst = 0;
  int64_t bad = 0, nan_both = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isnan(ref[i]) || std::isnan(got[i])) {
      if (std::isnan(ref[i]) && std::isnan(got[i])) {
        ++nan_both;
        continue;
      }
      if (bad++ < 5) ADD_FAILURE() << what << " element " << i << ": got " << got[i] << ", want " << ref[i];
      continue;
    }
    const double err = std::fabs(got[i] - ref[i]);
    const double tol = (bf16_out ? std::ldexp(std::fabs(ref[i]), -8) : 0.0) + std::ldexp(S[i], -12);
    if (err > tol && bad++ < 5)
      ADD_FAILURE() << what << " element " << i << ": got " << got[i] << ", want " << ref[i] << " (|diff| " << err
                    << " > tolerance " << tol << ", sum|ab| " << S[i] << ")";
    if (S[i] > 0) worst = std::max(worst, err / S[i]);
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " elements out of tolerance";
  std::printf("%s: worst |got - ref| / sum|ab| = %.3g (%s output), %lld NaN elements on both sides\n", what, worst,
              bf16_out ? "bf16" : "fp32", static_cast<long long>(nan_both));
}

// Forward / dgrad: C = A x B_e^T grouped over A's rows.
void run_grouped_m(Ops& gpu, const MxHost& A, const MxHost& B, const std::vector<int32_t>& off, DType out,
                   const char* what) {
  SCOPED_TRACE(what);
  const int64_t M = A.view().op_rows(), N = B.view().op_rows();
  const std::vector<double> ref = mxfp8::grouped_gemm_ref(A.view(), B.view(), off);
  const std::vector<double> S = mxfp8::grouped_gemm_ref(abs_copy(A).view(), abs_copy(B).view(), off);
  DeviceMx dA(gpu, A), dB(gpu, B);
  DeviceTensor doff = upload_i32(gpu, off, {static_cast<int64_t>(off.size())});
  // C starts as junk: every element must be overwritten (padding rows with zeros).
  DeviceTensor C = upload(gpu, random_values(M * N, 99), out, {M, N});
  mxfp8::grouped_gemm_cuda(cuda_of(gpu), dA.v, dB.v, doff, C);
  expect_close(download(gpu, C), ref, S, out == DType::BF16, what);
}

TEST(CudaMxfp8Gemm, ForwardUnevenEmptyExpertsAndPadding) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  const int64_t T = 300, in = 256, out = 192, E = 5;
  const std::vector<int32_t> off = {0, 100, 100, 163, 290, 290};  // experts 1 and 4 empty; rows 290.. padding
  const MxHost x = quantise(random_values(T * in, 1), 1, T, in, Format::E4M3, Direction::Rowwise);
  const MxHost w = quantise(random_values(E * out * in, 2), E, out, in, Format::E4M3, Direction::Rowwise);
  run_grouped_m(*gpu, x, w, off, DType::BF16, "forward bf16");
  run_grouped_m(*gpu, x, w, off, DType::F32, "forward fp32");
}

TEST(CudaMxfp8Gemm, ForwardPartialTilesAndStagesWithANaNBlock) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  const int64_t T = 64, in = 96, out = 72, E = 2;  // K = 96: a partial 128-byte stage; N = 72: a partial tile
  std::vector<float> xv = random_values(T * in, 3);
  xv[20 * in + 40] = std::numeric_limits<float>::quiet_NaN();  // row 20's second block: row 20 of C is NaN
  const MxHost x = quantise(xv, 1, T, in, Format::E4M3, Direction::Rowwise);
  const MxHost w = quantise(random_values(E * out * in, 4), E, out, in, Format::E4M3, Direction::Rowwise);
  run_grouped_m(*gpu, x, w, {0, 10, 64}, DType::F32, "forward partial tiles");
}

TEST(CudaMxfp8Gemm, DgradHybrid) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  const int64_t T = 200, in = 96, out = 160, E = 3;  // K = out = 160: one full stage and one of 32
  const std::vector<int32_t> off = {0, 0, 150, 190};  // expert 0 empty; rows 190.. padding
  const MxHost dy = quantise(random_values(T * out, 5), 1, T, out, Format::E5M2, Direction::Rowwise);
  const MxHost w = quantise(random_values(E * out * in, 6), E, out, in, Format::E4M3, Direction::Columnwise);
  run_grouped_m(*gpu, dy, w, off, DType::BF16, "dgrad E5M2 x E4M3");
  const MxHost dy4 = quantise(random_values(T * out, 7), 1, T, out, Format::E4M3, Direction::Rowwise);
  run_grouped_m(*gpu, dy4, w, off, DType::BF16, "dgrad E4M3 x E4M3");
}

// Wgrad: C[e] += dY_e^T X_e over each expert's tokens.
void run_wgrad(Ops& gpu, Format fdy, Format fx, const std::vector<int32_t>& off, const char* what) {
  SCOPED_TRACE(what);
  const int64_t T = 320, out = 96, in = 80, E = static_cast<int64_t>(off.size()) - 1;
  const MxHost dy = quantise(random_values(T * out, 8), 1, T, out, fdy, Direction::Columnwise);
  const MxHost x = quantise(random_values(T * in, 9), 1, T, in, fx, Direction::Columnwise);
  const std::vector<double> ref = mxfp8::grouped_gemm_wgrad_ref(dy.view(), x.view(), off);
  std::vector<double> S = mxfp8::grouped_gemm_wgrad_ref(abs_copy(dy).view(), abs_copy(x).view(), off);
  const std::vector<float> init = random_values(E * out * in, 10);
  std::vector<double> want(ref.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    want[i] = ref[i] + init[i];
    S[i] += std::fabs(init[i]);  // the fp32 add of the accumulated value
  }
  DeviceMx ddy(gpu, dy), dx(gpu, x);
  DeviceTensor doff = upload_i32(gpu, off, {static_cast<int64_t>(off.size())});
  DeviceTensor C = upload(gpu, init, DType::F32, {E, out, in});
  mxfp8::grouped_gemm_wgrad_cuda(cuda_of(gpu), ddy.v, dx.v, doff, C);
  const std::vector<float> got = download(gpu, C);
  expect_close(got, want, S, false, what);
  for (int64_t e = 0; e < E; ++e) {
    if (off[e + 1] != off[e]) continue;
    for (int64_t i = 0; i < out * in; ++i) ASSERT_EQ(got[e * out * in + i], init[e * out * in + i]) << "empty expert";
  }
}

TEST(CudaMxfp8Gemm, WgradRaggedAndEmptyExperts) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  // Group boundaries inside MX blocks (37, 301), an empty expert, unused tail tokens 301..319.
  run_wgrad(*gpu, Format::E5M2, Format::E4M3, {0, 37, 37, 160, 301}, "wgrad HYBRID ragged");
  run_wgrad(*gpu, Format::E4M3, Format::E4M3, {0, 64, 64, 256, 320}, "wgrad E4M3 aligned");
}

TEST(CudaMxfp8Gemm, LargerForward) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  const int64_t T = 1024, in = 1024, out = 512, E = 8;
  const std::vector<int32_t> off = {0, 3, 250, 250, 511, 700, 701, 1000, 1024};
  const MxHost x = quantise(random_values(T * in, 11), 1, T, in, Format::E4M3, Direction::Rowwise);
  const MxHost w = quantise(random_values(E * out * in, 12), E, out, in, Format::E4M3, Direction::Rowwise);
  run_grouped_m(*gpu, x, w, off, DType::BF16, "forward 1024 x 1024 x 512, 8 experts");
}

TEST(CudaMxfp8Gemm, RejectsMismatchedOperands) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  const MxHost a = quantise(random_values(64 * 64, 13), 1, 64, 64, Format::E4M3, Direction::Rowwise);
  const MxHost b = quantise(random_values(2 * 32 * 96, 14), 2, 32, 96, Format::E4M3, Direction::Rowwise);
  DeviceMx da(*gpu, a), db(*gpu, b);
  DeviceTensor off = upload_i32(*gpu, {0, 32, 64}, {3});
  DeviceTensor c(*gpu, DType::BF16, {64, 32});
  auto msg = [&](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "<nothing thrown>";
  };
  std::string m = msg([&] { mxfp8::grouped_gemm_cuda(cuda_of(*gpu), da.v, db.v, off, c); });
  EXPECT_NE(m.find("contraction dims differ"), std::string::npos) << m;
  DeviceTensor ci(*gpu, DType::I32, {64, 64});
  m = msg([&] { mxfp8::grouped_gemm_cuda(cuda_of(*gpu), da.v, da.v, off, ci); });
  EXPECT_NE(m.find("offsets"), std::string::npos) << m;  // da has batch 1: offsets must have 2 entries
}

}  // namespace
}  // namespace mxt::testing
