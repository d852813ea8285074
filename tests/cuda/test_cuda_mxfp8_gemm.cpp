// CUDA MXFP8 grouped GEMMs against the fp64 reference of the same quantised operands (mxfp8::grouped_gemm_ref,
// grouped_gemm_wgrad_ref): forward, dgrad and wgrad with mxfp8.md's operand copies, E4M3 and HYBRID (E5M2
// gradients), uneven and empty experts, capacity-padding rows, ragged wgrad groups, partial tiles and stages.
// On an sm_90 device the entry points run the Hopper kernels (asserted), and the Sm90* tests also compare them
// with the baseline kernels (the GPU oracle) on every format pair; the baseline keeps its own tests too.
//
// Tolerance, per element, with S = sum_k |a_k b_k| (the reference on sign-stripped operands):
//   |got - ref| <= 2^-12 S              fp32 outputs (wgrad): the tensor core's internal accumulation of each
//                                       32-product step (about 2^-14 S per step on Hopper, DeepSeek-V3 sec. 3.3)
//                                       and fp32 accumulation across steps, with margin;
//   |got - ref| <= 2^-8 |ref| + 2^-12 S bf16 outputs: plus bf16 rounding (2^-9 relative) with margin.
// A wrong scale, a wrong K pairing or a wrong expert is off by O(S), far outside these.
// The sm90 path gets 2^-10 S instead of 2^-12 S: Hopper's FP8 wgmma (QGMMA) sums the 32 products of a block with
// limited alignment precision, truncating towards zero (measured here: up to about 4.5e-4 S, the computed values
// consistently a little smaller in magnitude than the fp64 reference); the baseline's mma.sync (FP16 tensor-core
// path with fp32 accumulation on Hopper) keeps 2^-12. cuBLASLt's and DeepGEMM's Hopper FP8 GEMMs have the same
// property. Comparing two bf16 outputs (sm90 against the baseline) allows one bf16 rounding on each side: 2^-7|ref|.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
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

// True on a compute-capability 9.0 device (where the entry points must take the sm90 path).
bool on_sm90() {
  cudaDeviceProp prop{};
  return cudaGetDeviceProperties(&prop, 0) == cudaSuccess && prop.major == 9 && prop.minor == 0;
}
// True on sm_100 and later, where the dense entry points must take cuBLASLt's block-scaled path.
bool on_blackwell() {
  cudaDeviceProp prop{};
  return cudaGetDeviceProperties(&prop, 0) == cudaSuccess && prop.major >= 10;
}
// The path the entry points should have taken for an operand pair the sm90 kernels accept (dense: the dense
// entry points, which take cuBLASLt's path on Blackwell).
void expect_path(const char* what, bool dense = false) {
  const char* want = dense && on_blackwell() ? "sm100" : on_sm90() ? "sm90" : "baseline";
  EXPECT_STREQ(mxfp8::last_gemm_impl(), want) << what;
}

using Entry = void (*)(CudaOps&, const mxfp8::MxView&, const mxfp8::MxView&, const Tensor&, const Tensor&);

// Selects the implementation for one scope (tests restore Auto whatever happens).
struct ImplScope {
  explicit ImplScope(mxfp8::GemmImpl i) { mxfp8::set_gemm_impl(i); }
  ~ImplScope() { mxfp8::set_gemm_impl(mxfp8::GemmImpl::Auto); }
};

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
// Tolerance exponent of the sum term for the path the last call took (see the header).
// The sm100 path gets the sm90 path's bound too: Blackwell's block-scaled MMA has not been measured here.
int sum_exp() { return std::strcmp(mxfp8::last_gemm_impl(), "baseline") == 0 ? -12 : -10; }

void expect_close(const std::vector<float>& got, const std::vector<double>& ref, const std::vector<double>& S,
                  bool bf16_out, const char* what, int s_exp = -12, int r_exp = -8) {
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
    const double tol = (bf16_out ? std::ldexp(std::fabs(ref[i]), r_exp) : 0.0) + std::ldexp(S[i], s_exp);
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
                   const char* what, Entry entry = mxfp8::grouped_gemm_cuda) {
  SCOPED_TRACE(what);
  const int64_t M = A.view().op_rows(), N = B.view().op_rows();
  const std::vector<double> ref = mxfp8::grouped_gemm_ref(A.view(), B.view(), off);
  const std::vector<double> S = mxfp8::grouped_gemm_ref(abs_copy(A).view(), abs_copy(B).view(), off);
  DeviceMx dA(gpu, A), dB(gpu, B);
  DeviceTensor doff = upload_i32(gpu, off, {static_cast<int64_t>(off.size())});
  // C starts as junk: every element must be overwritten (padding rows with zeros).
  DeviceTensor C = upload(gpu, random_values(M * N, 99), out, {M, N});
  entry(cuda_of(gpu), dA.v, dB.v, doff, C);
  if (B.view().op_rows() % 8 == 0) expect_path(what, entry == mxfp8::dense_gemm_cuda);
  expect_close(download(gpu, C), ref, S, out == DType::BF16, what, sum_exp());
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
void run_wgrad(Ops& gpu, Format fdy, Format fx, const std::vector<int32_t>& off, const char* what,
               Entry entry = mxfp8::grouped_gemm_wgrad_cuda) {
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
  entry(cuda_of(gpu), ddy.v, dx.v, doff, C);
  expect_path(what, entry == mxfp8::dense_gemm_wgrad_cuda);
  const int se = sum_exp();
  const std::vector<float> got = download(gpu, C);
  expect_close(got, want, S, false, what, se);
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

TEST(CudaMxfp8Gemm, BaselineKernelsStillCorrect) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  ImplScope scope(mxfp8::GemmImpl::Baseline);
  const int64_t T = 300, in = 256, out = 192, E = 5;
  const std::vector<int32_t> off = {0, 100, 100, 163, 290, 290};
  const MxHost x = quantise(random_values(T * in, 21), 1, T, in, Format::E4M3, Direction::Rowwise);
  const MxHost w = quantise(random_values(E * out * in, 22), E, out, in, Format::E4M3, Direction::Rowwise);
  const std::vector<double> ref = mxfp8::grouped_gemm_ref(x.view(), w.view(), off);
  const std::vector<double> S = mxfp8::grouped_gemm_ref(abs_copy(x).view(), abs_copy(w).view(), off);
  DeviceMx dA(*gpu, x), dB(*gpu, w);
  DeviceTensor doff = upload_i32(*gpu, off, {static_cast<int64_t>(off.size())});
  DeviceTensor C = upload(*gpu, random_values(T * out, 23), DType::BF16, {T, out});
  mxfp8::grouped_gemm_cuda(cuda_of(*gpu), dA.v, dB.v, doff, C);
  EXPECT_STREQ(mxfp8::last_gemm_impl(), "baseline");
  expect_close(download(*gpu, C), ref, S, true, "baseline forward");
}

const Format kFormats[2] = {Format::E4M3, Format::E5M2};

// Forward / dgrad on the fast path for every format pair: against the fp64 reference and against the baseline
// kernel. K = 480 (15 MX blocks: the last 128-byte stage has 3), N = 200 (a partial 128-column tile), 8 experts
// with empty ones, a 1-row expert, tiles crossing expert ends, and 37 padding rows.
TEST(CudaMxfp8Gemm, Sm90RowsAllFormatsAgainstReferenceAndBaseline) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  const int64_t T = 700, K = 480, N = 200, E = 8;
  const std::vector<int32_t> off = {0, 0, 129, 130, 300, 300, 555, 600, 663};
  uint32_t seed = 100;
  for (Format fa : kFormats) {
    for (Format fb : kFormats) {
      const std::string what = std::string("rows ") + mxfp8::format_name(fa) + " x " + mxfp8::format_name(fb);
      SCOPED_TRACE(what);
      const MxHost a = quantise(random_values(T * K, ++seed), 1, T, K, fa, Direction::Rowwise);
      // B as a columnwise copy (dgrad's W): the same K-major operand layout the kernels read.
      const MxHost b = quantise(random_values(E * K * N, ++seed), E, K, N, fb, Direction::Columnwise);
      const std::vector<double> ref = mxfp8::grouped_gemm_ref(a.view(), b.view(), off);
      const std::vector<double> S = mxfp8::grouped_gemm_ref(abs_copy(a).view(), abs_copy(b).view(), off);
      DeviceMx dA(*gpu, a), dB(*gpu, b);
      DeviceTensor doff = upload_i32(*gpu, off, {static_cast<int64_t>(off.size())});
      for (DType dt : {DType::BF16, DType::F32}) {
        DeviceTensor C = upload(*gpu, random_values(T * N, ++seed), dt, {T, N});
        DeviceTensor Cb = upload(*gpu, random_values(T * N, ++seed), dt, {T, N});
        mxfp8::grouped_gemm_cuda(cuda_of(*gpu), dA.v, dB.v, doff, C);
        expect_path(what.c_str());
        const int se = sum_exp();
        mxfp8::grouped_gemm_baseline_cuda(cuda_of(*gpu), dA.v, dB.v, doff, Cb);
        const std::vector<float> got = download(*gpu, C), base = download(*gpu, Cb);
        const bool b16 = dt == DType::BF16;
        expect_close(got, ref, S, b16, (what + (b16 ? " bf16" : " fp32")).c_str(), se);
        std::vector<double> base_d(base.begin(), base.end());
        expect_close(got, base_d, S, b16, (what + (b16 ? " bf16 vs baseline" : " fp32 vs baseline")).c_str(), se, -7);
      }
    }
  }
}

// Wgrad on the fast path: groups with boundaries inside MX blocks, spanning several 128-byte stages, a 1-token
// group, a group inside one block, an empty group, unused tail tokens; every format pair; M = 136 and N = 200
// (partial tiles).
TEST(CudaMxfp8Gemm, Sm90WgradRaggedAllFormatsAgainstReferenceAndBaseline) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  const int64_t T = 1024, M = 136, N = 200;
  const std::vector<int32_t> off = {0, 5, 5, 300, 301, 310, 777, 1000};
  const int64_t E = static_cast<int64_t>(off.size()) - 1;
  uint32_t seed = 200;
  for (Format fa : kFormats) {
    for (Format fb : kFormats) {
      const std::string what = std::string("wgrad ") + mxfp8::format_name(fa) + " x " + mxfp8::format_name(fb);
      SCOPED_TRACE(what);
      const MxHost a = quantise(random_values(T * M, ++seed), 1, T, M, fa, Direction::Columnwise);
      const MxHost b = quantise(random_values(T * N, ++seed), 1, T, N, fb, Direction::Columnwise);
      const std::vector<double> ref = mxfp8::grouped_gemm_wgrad_ref(a.view(), b.view(), off);
      std::vector<double> S = mxfp8::grouped_gemm_wgrad_ref(abs_copy(a).view(), abs_copy(b).view(), off);
      const std::vector<float> init = random_values(E * M * N, ++seed);
      std::vector<double> want(ref.size());
      for (size_t i = 0; i < ref.size(); ++i) {
        want[i] = ref[i] + init[i];
        S[i] += std::fabs(init[i]);
      }
      DeviceMx dA(*gpu, a), dB(*gpu, b);
      DeviceTensor doff = upload_i32(*gpu, off, {static_cast<int64_t>(off.size())});
      DeviceTensor C = upload(*gpu, init, DType::F32, {E, M, N});
      DeviceTensor Cb = upload(*gpu, init, DType::F32, {E, M, N});
      mxfp8::grouped_gemm_wgrad_cuda(cuda_of(*gpu), dA.v, dB.v, doff, C);
      expect_path(what.c_str());
      const int se = sum_exp();
      mxfp8::grouped_gemm_wgrad_baseline_cuda(cuda_of(*gpu), dA.v, dB.v, doff, Cb);
      const std::vector<float> got = download(*gpu, C), base = download(*gpu, Cb);
      expect_close(got, want, S, false, what.c_str(), se);
      std::vector<double> base_d(base.begin(), base.end());
      expect_close(got, base_d, S, false, (what + " vs baseline").c_str(), se);
      for (int64_t e = 0; e < E; ++e) {
        if (off[e + 1] != off[e]) continue;
        for (int64_t i = 0; i < M * N; ++i)
          ASSERT_EQ(got[e * M * N + i], init[e * M * N + i]) << "empty expert " << e;
      }
    }
  }
}

// A NaN block (scale 0xFF) straddling a group boundary: the whole block dequantises to NaN, so both groups'
// outputs that read it are NaN in the reference, and must be on the GPU too (and no others).
TEST(CudaMxfp8Gemm, Sm90WgradNaNStaysInItsGroup) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  const int64_t T = 256, M = 64, N = 64;
  const std::vector<int32_t> off = {0, 40, 256};
  std::vector<float> av = random_values(T * M, 301), bv = random_values(T * N, 302);
  bv[50 * N + 3] = std::numeric_limits<float>::quiet_NaN();  // token 50 (group 1), feature 3 of B
  const MxHost a = quantise(av, 1, T, M, Format::E4M3, Direction::Columnwise);
  const MxHost b = quantise(bv, 1, T, N, Format::E4M3, Direction::Columnwise);
  const std::vector<double> ref = mxfp8::grouped_gemm_wgrad_ref(a.view(), b.view(), off);
  const std::vector<double> S = mxfp8::grouped_gemm_wgrad_ref(abs_copy(a).view(), abs_copy(b).view(), off);
  DeviceMx dA(*gpu, a), dB(*gpu, b);
  DeviceTensor doff = upload_i32(*gpu, off, {3});
  DeviceTensor C(*gpu, DType::F32, {2, M, N});
  cuda_of(*gpu).zero(C);
  mxfp8::grouped_gemm_wgrad_cuda(cuda_of(*gpu), dA.v, dB.v, doff, C);
  expect_path("wgrad NaN");
  const int se = sum_exp();
  expect_close(download(*gpu, C), ref, S, false, "wgrad NaN in a straddling block", se);
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

// The dense entry points (the MXFP8 linears: one group over every row). On Blackwell they are cuBLASLt's
// block-scaled GEMM (never run yet: no such GPU here), elsewhere the grouped kernels; either way the fp64
// reference of the same operands, forward and dgrad into bf16 and fp32, wgrad accumulating into fp32.
TEST(CudaMxfp8Gemm, DenseEntryPoints) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  const int64_t T = 256, in = 320, out = 192;
  const MxHost x = quantise(random_values(T * in, 21), 1, T, in, Format::E4M3, Direction::Rowwise);
  const MxHost w = quantise(random_values(out * in, 22), 1, out, in, Format::E4M3, Direction::Rowwise);
  run_grouped_m(*gpu, x, w, {0, static_cast<int32_t>(T)}, DType::BF16, "dense forward bf16", mxfp8::dense_gemm_cuda);
  run_grouped_m(*gpu, x, w, {0, static_cast<int32_t>(T)}, DType::F32, "dense forward fp32", mxfp8::dense_gemm_cuda);
  const MxHost dy = quantise(random_values(T * out, 23), 1, T, out, Format::E5M2, Direction::Rowwise);
  const MxHost wc = quantise(random_values(out * in, 22), 1, out, in, Format::E4M3, Direction::Columnwise);
  run_grouped_m(*gpu, dy, wc, {0, static_cast<int32_t>(T)}, DType::BF16, "dense dgrad HYBRID", mxfp8::dense_gemm_cuda);
  run_wgrad(*gpu, Format::E5M2, Format::E4M3, {0, 320}, "dense wgrad HYBRID", mxfp8::dense_gemm_wgrad_cuda);
  run_wgrad(*gpu, Format::E4M3, Format::E4M3, {0, 320}, "dense wgrad E4M3", mxfp8::dense_gemm_wgrad_cuda);
}

// cuBLASLt's scale tiles made on the device, byte for byte the CPU twin's (runs on any GPU).
TEST(CudaMxfp8Gemm, TileScalesBitExactWithCpuTwin) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  std::mt19937 rng(31);
  struct Shape { int64_t batch, rows, C; };
  for (const Shape& sh : {Shape{1, 1, 1}, Shape{2, 200, 6}, Shape{3, 130, 5}, Shape{1, 4096, 128}}) {
    std::vector<uint8_t> s(static_cast<size_t>(sh.batch * sh.rows * sh.C));
    for (uint8_t& v : s) v = static_cast<uint8_t>(1 + rng() % 254);
    const size_t tiled = static_cast<size_t>(sh.batch * mxfp8::tiled_scale_bytes(sh.rows, sh.C));
    std::vector<uint8_t> want(tiled);
    mxfp8::tile_scales(s.data(), sh.batch, sh.rows, sh.C, want.data());
    void* ds = gpu->alloc(s.size());
    void* dout = gpu->alloc(tiled);
    gpu->upload(ds, s.data(), s.size());
    gpu->upload(dout, std::vector<uint8_t>(tiled, 0xAB).data(), tiled);  // the padding must be written too
    mxfp8::tile_scales_cuda(cuda_of(*gpu), static_cast<const uint8_t*>(ds), sh.batch, sh.rows, sh.C,
                            static_cast<uint8_t*>(dout));
    std::vector<uint8_t> got(tiled);
    gpu->download(got.data(), dout, tiled);
    gpu->release(ds);
    gpu->release(dout);
    EXPECT_EQ(got, want) << sh.batch << " x " << sh.rows << " x " << sh.C;
  }
}

}  // namespace
}  // namespace mxt::testing
