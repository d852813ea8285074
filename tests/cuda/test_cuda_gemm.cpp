// CUDA GEMMs against their CPU twins: dense gemm (cuBLASLt) and the grouped expert GEMMs (wmma kernels).
// Inputs are rounded to bf16 and the CPU twin gets the same rounded values, so the only differences are the
// fp32 summation order and, for BF16 outputs, the final rounding to bf16 (relative error ~2^-9 per element).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "cuda_test_util.hpp"

namespace mxt::testing {
namespace {

constexpr double kTolBf16 = 1e-2;  // BF16 outputs: one bf16 rounding of each element (~2e-3 rel L2)
constexpr double kTolF32 = 1e-5;   // F32 outputs: same products, fp32 sums in another order

std::vector<float> rounded_randn(size_t n, uint32_t seed, float scale = 1.f) {
  auto v = randn(n, seed, scale);
  round_bf16(v);
  return v;
}

// Uploads host floats into an existing device buffer (any alignment), as BF16 or F32.
void upload_into(Ops& o, void* dst, const std::vector<float>& v, DType dtype) {
  if (dtype == DType::F32) {
    o.upload(dst, v.data(), v.size() * 4);
  } else {
    std::vector<uint16_t> b(v.size());
    for (size_t i = 0; i < v.size(); ++i) b[i] = f32_to_bf16_bits(v[i]);
    o.upload(dst, b.data(), b.size() * 2);
  }
}

std::string gemm_case(bool ta, bool tb, int64_t M, int64_t N, int64_t K, DType c, float alpha, float beta) {
  return "trans_a=" + std::to_string(ta) + " trans_b=" + std::to_string(tb) + " M=" + std::to_string(M) +
         " N=" + std::to_string(N) + " K=" + std::to_string(K) + " C=" + dtype_name(c) +
         " alpha=" + std::to_string(alpha) + " beta=" + std::to_string(beta);
}

// One gemm on both backends. With beta = 0 the device C starts as NaN (it must not be read); otherwise both
// start from the same random C (rounded to bf16 when C is BF16).
void check_gemm(Ops& gpu, Ops& cpu, bool ta, bool tb, int64_t M, int64_t N, int64_t K, DType c_dtype, float alpha,
                float beta, uint32_t seed) {
  SCOPED_TRACE(gemm_case(ta, tb, M, N, K, c_dtype, alpha, beta));
  auto a = rounded_randn(M * K, seed);
  auto b = rounded_randn(K * N, seed + 1);
  auto c = randn(M * N, seed + 2);
  if (c_dtype == DType::BF16) round_bf16(c);
  std::vector<float> c_dev = c;
  if (beta == 0.f) c_dev.assign(c.size(), std::numeric_limits<float>::quiet_NaN());

  auto A = upload(gpu, a, DType::BF16, {ta ? K : M, ta ? M : K});
  auto B = upload(gpu, b, DType::BF16, {tb ? N : K, tb ? K : N});
  auto C = upload(gpu, c_dev, c_dtype, {M, N});
  gpu.gemm(ta, tb, M, N, K, alpha, A, B, beta, C);
  const auto got = download(gpu, C);

  std::vector<float> ref = c;
  cpu.gemm(ta, tb, M, N, K, alpha, host(a, {ta ? K : M, ta ? M : K}), host(b, {tb ? N : K, tb ? K : N}), beta,
           host(ref, {M, N}));
  EXPECT_CLOSE_REL(got, ref, c_dtype == DType::BF16 ? kTolBf16 : kTolF32);
}

TEST(CudaGemm, AllTransposesDtypesAndBetaOddSizes) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  auto cpu = make_cpu_ops();
  uint32_t seed = 100;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (DType c : {DType::BF16, DType::F32})
        for (float beta : {0.f, 1.f}) {
          check_gemm(*gpu, *cpu, ta, tb, 33, 65, 47, c, 1.f, beta, seed);
          seed += 10;
        }
}

TEST(CudaGemm, AlphaBetaScalingAndTinyShapes) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  auto cpu = make_cpu_ops();
  check_gemm(*gpu, *cpu, false, true, 17, 9, 31, DType::F32, 0.5f, 0.25f, 7);
  check_gemm(*gpu, *cpu, true, false, 9, 17, 5, DType::BF16, -2.f, 0.5f, 8);
  check_gemm(*gpu, *cpu, false, false, 1, 1, 1, DType::F32, 1.f, 0.f, 9);
  check_gemm(*gpu, *cpu, true, true, 1, 129, 3, DType::F32, 1.f, 1.f, 10);
}

TEST(CudaGemm, Big) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  auto cpu = make_cpu_ops();
  uint32_t seed = 500;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      check_gemm(*gpu, *cpu, ta, tb, 512, 1024, 768, DType::BF16, 1.f, 0.f, seed++);
      check_gemm(*gpu, *cpu, ta, tb, 512, 1024, 768, DType::F32, 1.f, 1.f, seed++);
    }
}

// Repeated calls (cached plan) on new data must give new, right answers.
TEST(CudaGemm, RepeatedShapeUsesFreshData) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  auto cpu = make_cpu_ops();
  for (uint32_t s = 0; s < 3; ++s) check_gemm(*gpu, *cpu, false, true, 64, 96, 128, DType::BF16, 1.f, 0.f, 900 + s);
}

// Operands at odd addresses (views into a larger buffer): the plan must not assume 16-byte alignment.
TEST(CudaGemm, UnalignedViews) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  auto cpu = make_cpu_ops();
  const int64_t M = 40, N = 24, K = 32;
  auto a = rounded_randn(M * K, 31), b = rounded_randn(N * K, 32), c = rounded_randn(M * N, 33);
  DeviceTensor abuf(*gpu, DType::BF16, {M * K + 1}), bbuf(*gpu, DType::BF16, {N * K + 3});
  DeviceTensor cbuf(*gpu, DType::F32, {M * N + 1});
  Tensor A(static_cast<uint16_t*>(abuf.t.data) + 1, DType::BF16, {M, K}, Device::CUDA);
  Tensor B(static_cast<uint16_t*>(bbuf.t.data) + 3, DType::BF16, {N, K}, Device::CUDA);
  Tensor C(static_cast<float*>(cbuf.t.data) + 1, DType::F32, {M, N}, Device::CUDA);
  upload_into(*gpu, A.data, a, DType::BF16);
  upload_into(*gpu, B.data, b, DType::BF16);
  upload_into(*gpu, C.data, c, DType::F32);
  gpu->gemm(false, true, M, N, K, 1.f, A, B, 1.f, C);
  const auto got = download(*gpu, C);
  std::vector<float> ref = c;
  cpu->gemm(false, true, M, N, K, 1.f, host(a, {M, K}), host(b, {N, K}), 1.f, host(ref, {M, N}));
  EXPECT_CLOSE_REL(got, ref, kTolF32);
}

// K = 0: C = beta C (beta = 0 clears, even NaN); M or N = 0: nothing to do.
TEST(CudaGemm, DegenerateSizes) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  const int64_t M = 5, N = 7;
  auto c = randn(M * N, 41);
  DeviceTensor A(*gpu, DType::BF16, {M, 0}), B(*gpu, DType::BF16, {0, N});
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    std::vector<float> c0 = c;
    if (dt == DType::BF16) round_bf16(c0);
    auto C = upload(*gpu, c0, dt, {M, N});
    gpu->gemm(false, false, M, N, 0, 1.f, A, B, 0.5f, C);
    auto got = download(*gpu, C);
    for (size_t i = 0; i < got.size(); ++i) {
      const float want = dt == DType::BF16 ? round_bf16(0.5f * c0[i]) : 0.5f * c0[i];
      ASSERT_EQ(got[i], want) << i;
    }
    upload_into(*gpu, C.t.data, std::vector<float>(M * N, std::numeric_limits<float>::quiet_NaN()), dt);
    gpu->gemm(true, true, M, N, 0, 1.f, A, B, 0.f, C);
    got = download(*gpu, C);
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], 0.f) << i;
  }
  DeviceTensor E0(*gpu, DType::BF16, {0, 3}), E1(*gpu, DType::BF16, {3, 4}), C0(*gpu, DType::F32, {0, 4});
  gpu->gemm(false, false, 0, 4, 3, 1.f, E0, E1, 1.f, C0);  // M = 0: a no-op that must not fail
  gpu->synchronize();
}

TEST(CudaGemm, RejectsWrongDtypesAndShapes) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  DeviceTensor A(*gpu, DType::BF16, {4, 8}), B(*gpu, DType::BF16, {8, 3}), C(*gpu, DType::F32, {4, 3});
  DeviceTensor Af(*gpu, DType::F32, {4, 8}), Ci(*gpu, DType::I32, {4, 3});
  EXPECT_NO_THROW(gpu->gemm(false, false, 4, 3, 8, 1.f, A, B, 0.f, C));
  EXPECT_THROW(gpu->gemm(false, false, 4, 3, 8, 1.f, Af, B, 0.f, C), std::runtime_error);  // A must be BF16
  EXPECT_THROW(gpu->gemm(false, false, 4, 3, 8, 1.f, A, B, 0.f, Ci), std::runtime_error);  // C F32 / BF16
  EXPECT_THROW(gpu->gemm(false, false, 4, 3, 7, 1.f, A, B, 0.f, C), std::runtime_error);   // numel of A
  gpu->synchronize();
}

// ---- grouped expert GEMMs -----------------------------------------------------------------------------

struct GroupCase {
  int64_t in, out;
  std::vector<int32_t> loads;  // rows per expert
  int64_t padding;             // rows past offsets[E]
};

std::vector<int32_t> offsets_of(const std::vector<int32_t>& loads) {
  std::vector<int32_t> off(loads.size() + 1, 0);
  for (size_t e = 0; e < loads.size(); ++e) off[e + 1] = off[e] + loads[e];
  return off;
}

// Elements in [begin, end) that are not exactly +0 or -0 (NaN counts as nonzero).
int64_t count_nonzero(const std::vector<float>& v, int64_t begin, int64_t end) {
  int64_t n = 0;
  for (int64_t i = begin; i < end; ++i) n += !(v[i] == 0.f);
  return n;
}

std::string group_case(const GroupCase& g) {
  std::string s = "in=" + std::to_string(g.in) + " out=" + std::to_string(g.out) + " loads={";
  for (size_t e = 0; e < g.loads.size(); ++e) s += (e ? "," : "") + std::to_string(g.loads[e]);
  return s + "} padding=" + std::to_string(g.padding);
}

// Forward, dgrad and wgrad of one configuration against the CPU twin. Overwrite outputs start as NaN on the
// device (every row, padding included, must be written); dW starts from the same random values on both sides.
void check_grouped(Ops& gpu, Ops& cpu, const GroupCase& g, uint32_t seed) {
  SCOPED_TRACE(group_case(g));
  const int64_t E = static_cast<int64_t>(g.loads.size());
  auto off = offsets_of(g.loads);
  const int64_t used = off[E], R = used + g.padding;
  auto x = rounded_randn(R * g.in, seed);
  auto w = rounded_randn(E * g.out * g.in, seed + 1, 0.1f);
  auto dy = rounded_randn(R * g.out, seed + 2);
  auto dw0 = randn(E * g.out * g.in, seed + 3);
  const float nan = std::numeric_limits<float>::quiet_NaN();

  auto X = upload(gpu, x, DType::BF16, {R, g.in});
  auto W = upload(gpu, w, DType::BF16, {E, g.out, g.in});
  auto DY = upload(gpu, dy, DType::BF16, {R, g.out});
  auto OFF = upload_i32(gpu, off, {E + 1});
  auto Y = upload(gpu, std::vector<float>(R * g.out, nan), DType::BF16, {R, g.out});
  auto DX = upload(gpu, std::vector<float>(R * g.in, nan), DType::BF16, {R, g.in});
  auto DW = upload(gpu, dw0, DType::F32, {E, g.out, g.in});
  gpu.grouped_gemm(X, W, OFF, Y);
  gpu.grouped_gemm_dgrad(DY, W, OFF, DX);
  gpu.grouped_gemm_wgrad(DY, X, OFF, DW);
  const auto y = download(gpu, Y), dx = download(gpu, DX), dw = download(gpu, DW);

  std::vector<float> y_ref(R * g.out, nan), dx_ref(R * g.in, nan), dw_ref = dw0;
  cpu.grouped_gemm(host(x, {R, g.in}), host(w, {E, g.out, g.in}), host_i32(off, {E + 1}), host(y_ref, {R, g.out}));
  cpu.grouped_gemm_dgrad(host(dy, {R, g.out}), host(w, {E, g.out, g.in}), host_i32(off, {E + 1}),
                         host(dx_ref, {R, g.in}));
  cpu.grouped_gemm_wgrad(host(dy, {R, g.out}), host(x, {R, g.in}), host_i32(off, {E + 1}),
                         host(dw_ref, {E, g.out, g.in}));

  {
    SCOPED_TRACE("forward");
    EXPECT_CLOSE_REL(y, y_ref, kTolBf16);
    EXPECT_EQ(count_nonzero(y, used * g.out, R * g.out), 0) << "padding rows of y not zeroed";
  }
  {
    SCOPED_TRACE("dgrad");
    EXPECT_CLOSE_REL(dx, dx_ref, kTolBf16);
    EXPECT_EQ(count_nonzero(dx, used * g.in, R * g.in), 0) << "padding rows of dx not zeroed";
  }
  {
    SCOPED_TRACE("wgrad");
    EXPECT_CLOSE_REL(dw, dw_ref, kTolF32);
    for (int64_t e = 0; e < E; ++e) {
      if (g.loads[e] != 0) continue;  // an expert without rows leaves dW[e] bit-for-bit unchanged
      int64_t changed = 0;
      for (int64_t i = e * g.out * g.in; i < (e + 1) * g.out * g.in; ++i) changed += dw[i] != dw0[i];
      EXPECT_EQ(changed, 0) << "dW of expert " << e << " (no rows) changed";
    }
  }
}

TEST(CudaGroupedGemm, UnevenLoadsSmallOddDims) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  auto cpu = make_cpu_ops();
  check_grouped(*gpu, *cpu, {40, 72, {37, 0, 101, 5}, 3}, 1);
  check_grouped(*gpu, *cpu, {72, 40, {37, 0, 101, 5}, 3}, 2);
  check_grouped(*gpu, *cpu, {17, 9, {1, 64, 65, 0, 2}, 70}, 3);  // tile-edge loads, padding over a tile
}

TEST(CudaGroupedGemm, UnevenLoadsModelShapes) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  auto cpu = make_cpu_ops();
  check_grouped(*gpu, *cpu, {256, 1024, {37, 0, 101, 5}, 3}, 11);
  check_grouped(*gpu, *cpu, {1024, 256, {37, 0, 101, 5}, 3}, 12);
  check_grouped(*gpu, *cpu, {256, 512, {130, 3, 0, 64, 200, 1, 0, 90}, 17}, 13);
  check_grouped(*gpu, *cpu, {2048, 4096, {150, 0, 77}, 9}, 14);
  check_grouped(*gpu, *cpu, {4096, 2048, {61, 190}, 5}, 15);
}

TEST(CudaGroupedGemm, AllRowsPaddingOrNoRows) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  auto cpu = make_cpu_ops();
  check_grouped(*gpu, *cpu, {40, 72, {0, 0, 0}, 130}, 21);  // offsets all zero: every row is padding
  check_grouped(*gpu, *cpu, {40, 72, {5, 0, 6}, 0}, 22);    // no padding at all
}

TEST(CudaGroupedGemm, RejectsWrongDtypesAndShapes) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  DeviceTensor x(*gpu, DType::BF16, {10, 8}), W(*gpu, DType::BF16, {2, 6, 8}), y(*gpu, DType::BF16, {10, 6});
  DeviceTensor off(*gpu, DType::I32, {3}), off_bad(*gpu, DType::I32, {2}), off_f(*gpu, DType::F32, {3});
  DeviceTensor y_bad(*gpu, DType::BF16, {10, 7}), dW_bf(*gpu, DType::BF16, {2, 6, 8});
  EXPECT_NO_THROW(gpu->grouped_gemm(x, W, off, y));
  EXPECT_THROW(gpu->grouped_gemm(x, W, off_bad, y), std::runtime_error);
  EXPECT_THROW(gpu->grouped_gemm(x, W, off_f, y), std::runtime_error);
  EXPECT_THROW(gpu->grouped_gemm(x, W, off, y_bad), std::runtime_error);
  EXPECT_THROW(gpu->grouped_gemm_wgrad(y, x, off, dW_bf), std::runtime_error);  // dW must be F32
  gpu->synchronize();
}

}  // namespace
}  // namespace mxt::testing
