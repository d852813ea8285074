// CUDA elementwise, embedding, RMSNorm, RoPE and AdamW ops against their CPU twins (CpuOps), on the same
// bf16-rounded inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "cuda_test_util.hpp"

namespace mxt::testing {
namespace {

std::vector<float> rounded_randn(size_t n, uint32_t seed, float scale = 1.f) {
  auto v = randn(n, seed, scale);
  round_bf16(v);
  return v;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// ---- copy ----------------------------------------------------------------------------------------

TEST(CudaBasicOps, CopyRoundTripIsRoundToNearestEven) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  for (int64_t n : {1, 7, 8, 1023, 4096, 100000, 100003}) {  // n % 8 == 0: the 16-byte fp32 -> bf16 kernel
    auto x = randn(static_cast<size_t>(n), 11 + static_cast<uint32_t>(n), 3.f);
    // Ties (exactly halfway between two bf16 values) must round to even, both directions.
    const float ties[] = {1.00390625f /* 1 + 2^-8: down to 1 */, 1.01171875f /* 1 + 3*2^-8: up */,
                          -1.00390625f, -1.01171875f, 3.0e38f, 1.0e-39f /* subnormal */, 0.f, -0.f};
    for (size_t i = 0; i < std::size(ties) && i < x.size(); ++i) x[i] = ties[i];
    auto src = upload(*gpu, x, DType::F32, {n});
    DeviceTensor mid(*gpu, DType::BF16, {n});
    DeviceTensor back(*gpu, DType::F32, {n});
    gpu->copy(src, mid);
    gpu->copy(mid, back);
    auto got = download(*gpu, back.t);
    std::vector<float> want(x);
    round_bf16(want);
    EXPECT_TRUE(bitwise_equal(got, want)) << "n=" << n;
    if (n >= 2) {
      EXPECT_EQ(got[0], 1.0f);
      EXPECT_EQ(got[1], 1.015625f);
    }
    // Same-dtype copies are exact.
    DeviceTensor mid2(*gpu, DType::BF16, {n});
    gpu->copy(mid, mid2);
    EXPECT_TRUE(bitwise_equal(download(*gpu, mid2.t), want));
    DeviceTensor f2(*gpu, DType::F32, {n});
    gpu->copy(src, f2);
    EXPECT_TRUE(bitwise_equal(download(*gpu, f2.t), x));
  }
}

TEST(CudaBasicOps, ZeroClearsEveryDtype) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  const int64_t n = 1001;
  auto f = upload(*gpu, randn(n, 5), DType::F32, {n});
  auto b = upload(*gpu, randn(n, 6), DType::BF16, {n});
  gpu->zero(f);
  gpu->zero(b);
  for (float v : download(*gpu, f.t)) ASSERT_EQ(v, 0.f);
  for (float v : download(*gpu, b.t)) ASSERT_EQ(v, 0.f);
}

TEST(CudaBasicOps, ErrorsNameOpAndArgument) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  DeviceTensor a(*gpu, DType::F32, {10}), b(*gpu, DType::BF16, {11}), i(*gpu, DType::I32, {10});
  try {
    gpu->copy(a, b);
    FAIL() << "copy with different numel must throw";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("copy"), std::string::npos) << e.what();
  }
  try {
    gpu->add(a, i, a);
    FAIL() << "add of an I32 tensor must throw";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("add: b"), std::string::npos) << e.what();
  }
  DeviceTensor x(*gpu, DType::BF16, {4, 2, 7});
  DeviceTensor pos(*gpu, DType::I32, {4});
  EXPECT_THROW(gpu->rope_forward(x, pos, 1e4f), std::exception);  // odd head_dim
  DeviceTensor acc(*gpu, DType::BF16, {1});
  EXPECT_THROW(gpu->sum_squares(a, acc), std::exception);  // acc must be F32
}

// ---- add / mul / scale ---------------------------------------------------------------------------

TEST(CudaBasicOps, AddMulScaleMatchCpu) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  auto cpu = make_cpu_ops();
  for (int64_t n : {1, 255, 70001, 4096, 70000}) {  // n % 8 == 0: the 16-byte bf16 kernel
    for (DType dt : {DType::F32, DType::BF16}) {
      auto xa = rounded_randn(n, 21, 2.f), xb = rounded_randn(n, 22, 0.5f);
      std::vector<float> ref_add(n), ref_mul(n), ref_scale(xa);
      cpu->add(host(xa, {n}), host(xb, {n}), host(ref_add, {n}));
      cpu->mul(host(xa, {n}), host(xb, {n}), host(ref_mul, {n}));
      cpu->scale(host(ref_scale, {n}), -0.37f);
      if (dt == DType::BF16) {  // fp32 math, one rounding of the result: exactly round_bf16 of the fp32 twin
        round_bf16(ref_add);
        round_bf16(ref_mul);
        round_bf16(ref_scale);
      }
      auto a = upload(*gpu, xa, dt, {n});
      auto b = upload(*gpu, xb, dt, {n});
      DeviceTensor out(*gpu, dt, {n});
      gpu->add(a, b, out);
      EXPECT_TRUE(bitwise_equal(download(*gpu, out.t), ref_add)) << "add n=" << n;
      EXPECT_CLOSE_REL(download(*gpu, out.t), ref_add, 1e-6);
      gpu->mul(a, b, out);
      EXPECT_TRUE(bitwise_equal(download(*gpu, out.t), ref_mul)) << "mul n=" << n;
      gpu->scale(a, -0.37f);
      EXPECT_TRUE(bitwise_equal(download(*gpu, a.t), ref_scale)) << "scale n=" << n;
    }
  }
}

TEST(CudaBasicOps, AddMulAliasingAndMixedDtypes) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  auto cpu = make_cpu_ops();
  const int64_t n = 4097;
  auto xa = rounded_randn(n, 31), xb = rounded_randn(n, 32);
  std::vector<float> ref(n);
  cpu->add(host(xa, {n}), host(xb, {n}), host(ref, {n}));
  // out aliases a (in-place accumulate, as a residual add does), then b; n - 1 elements: the 16-byte kernel.
  for (const int64_t m : {n, n - 1}) {
    auto a = upload(*gpu, std::vector<float>(xa.begin(), xa.begin() + m), DType::BF16, {m});
    auto b = upload(*gpu, std::vector<float>(xb.begin(), xb.begin() + m), DType::BF16, {m});
    std::vector<float> ref_bf(ref.begin(), ref.begin() + m);
    round_bf16(ref_bf);
    gpu->add(a, b, a);
    EXPECT_TRUE(bitwise_equal(download(*gpu, a.t), ref_bf)) << "m=" << m;
    auto a1 = upload(*gpu, std::vector<float>(xa.begin(), xa.begin() + m), DType::BF16, {m});
    gpu->add(a1, b, b);
    EXPECT_TRUE(bitwise_equal(download(*gpu, b.t), ref_bf)) << "m=" << m;
  }
  // bf16 a + f32 b -> f32 out (no rounding of the result).
  auto a2 = upload(*gpu, xa, DType::BF16, {n});
  auto b2 = upload(*gpu, xb, DType::F32, {n});
  DeviceTensor o2(*gpu, DType::F32, {n});
  gpu->add(a2, b2, o2);
  EXPECT_TRUE(bitwise_equal(download(*gpu, o2.t), ref));
  // out aliases b for mul.
  std::vector<float> refm(n);
  cpu->mul(host(xa, {n}), host(xb, {n}), host(refm, {n}));
  auto a3 = upload(*gpu, xa, DType::F32, {n});
  auto b3 = upload(*gpu, xb, DType::F32, {n});
  gpu->mul(a3, b3, b3);
  EXPECT_TRUE(bitwise_equal(download(*gpu, b3.t), refm));
}

// ---- sum_squares ---------------------------------------------------------------------------------

TEST(CudaBasicOps, SumSquaresMatchesCpuAndIsDeterministic) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  auto cpu = make_cpu_ops();
  for (int64_t n : {1, 257, 3000001}) {
    for (DType dt : {DType::F32, DType::BF16}) {
      auto x = randn(n, 41, 0.3f);
      if (dt == DType::BF16) round_bf16(x);
      std::vector<float> ref_acc = {1.5f};
      cpu->sum_squares(host(x, {n}), host(ref_acc, {1}));
      auto t = upload(*gpu, x, dt, {n});
      std::vector<float> got[2];
      for (auto& g : got) {
        auto acc = upload(*gpu, std::vector<float>{1.5f}, DType::F32, {1});
        gpu->sum_squares(t, acc);
        g = download(*gpu, acc.t);
      }
      EXPECT_NEAR(got[0][0], ref_acc[0], 1e-6 * std::abs(ref_acc[0])) << "n=" << n;
      EXPECT_TRUE(bitwise_equal(got[0], got[1])) << "not deterministic, n=" << n;
      EXPECT_GT(got[0][0], 1.5f);
    }
  }
  // Accumulates across calls: two calls add twice the sum.
  const int64_t n = 10007;
  auto x = randn(n, 43);
  std::vector<float> ref = {0.f};
  cpu->sum_squares(host(x, {n}), host(ref, {1}));
  cpu->sum_squares(host(x, {n}), host(ref, {1}));
  auto t = upload(*gpu, x, DType::F32, {n});
  DeviceTensor acc(*gpu, DType::F32, {1});
  gpu->sum_squares(t, acc);
  gpu->sum_squares(t, acc);
  EXPECT_NEAR(download(*gpu, acc.t)[0], ref[0], 1e-6 * ref[0]);
}

// ---- embedding -----------------------------------------------------------------------------------

std::vector<int32_t> random_ids(int64_t T, int64_t V, uint32_t seed, int32_t hot_id = -1) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, static_cast<int32_t>(V - 1));
  std::vector<int32_t> ids(T);
  for (int64_t t = 0; t < T; ++t) ids[t] = (hot_id >= 0 && t % 3 == 0) ? hot_id : d(rng);
  return ids;
}

TEST(CudaBasicOps, EmbeddingForwardIsExact) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  auto cpu = make_cpu_ops();
  struct Case { int64_t T, V, d; };
  for (const Case c : {Case{1, 5, 8}, Case{513, 1000, 64}, Case{300, 77, 37}, Case{1029, 3001, 4096}}) {
    auto ids = random_ids(c.T, c.V, 51 + static_cast<uint32_t>(c.d), 3);
    ids[0] = static_cast<int32_t>(c.V - 1);
    auto table = rounded_randn(c.V * c.d, 52);
    std::vector<float> ref(c.T * c.d);
    cpu->embedding_forward(host_i32(ids, {c.T}), host(table, {c.V, c.d}), host(ref, {c.T, c.d}));
    auto gids = upload_i32(*gpu, ids, {c.T});
    auto gtab = upload(*gpu, table, DType::BF16, {c.V, c.d});
    auto gout = upload(*gpu, randn(c.T * c.d, 53), DType::BF16, {c.T, c.d});  // overwritten
    gpu->embedding_forward(gids, gtab, gout);
    EXPECT_TRUE(bitwise_equal(download(*gpu, gout.t), ref)) << "T=" << c.T << " d=" << c.d;
  }
}

TEST(CudaBasicOps, EmbeddingBackwardRepeatedIdsDeterministic) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  auto cpu = make_cpu_ops();
  struct Case { int64_t T, V, d; };
  for (const Case c : {Case{1, 3, 5}, Case{4099, 300, 130}, Case{2000, 50, 64}, Case{32768, 128256, 96}}) {
    // One hot id on every third token and many random repeats; the table gradient starts non-zero.
    auto ids = random_ids(c.T, c.V, 61 + static_cast<uint32_t>(c.T), c.T > 1 ? 7 % c.V : -1);
    auto dout = rounded_randn(c.T * c.d, 62);
    auto dtab0 = randn(c.V * c.d, 63, 0.1f);
    std::vector<float> ref(dtab0);
    cpu->embedding_backward(host_i32(ids, {c.T}), host(dout, {c.T, c.d}), host(ref, {c.V, c.d}));
    auto gids = upload_i32(*gpu, ids, {c.T});
    auto gdout = upload(*gpu, dout, DType::BF16, {c.T, c.d});
    std::vector<float> got[2];
    for (auto& g : got) {
      auto gdt = upload(*gpu, dtab0, DType::F32, {c.V, c.d});
      gpu->embedding_backward(gids, gdout, gdt);
      g = download(*gpu, gdt.t);
    }
    EXPECT_CLOSE_REL(got[0], ref, 1e-6);
    EXPECT_LT(max_abs_diff(got[0], ref), 1e-5) << "T=" << c.T;
    EXPECT_TRUE(bitwise_equal(got[0], got[1])) << "not deterministic, T=" << c.T;
  }
}

// ---- RMSNorm -------------------------------------------------------------------------------------

TEST(CudaBasicOps, RmsNormForwardMatchesCpuAndHfRounding) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  auto cpu = make_cpu_ops();
  const float eps = 1e-5f;
  struct Case { int64_t T, d; };
  for (const Case c : {Case{1, 64}, Case{7, 1000}, Case{300, 4096}, Case{5, 33}, Case{3, 16384}}) {
    auto x = rounded_randn(c.T * c.d, 71, 2.f);
    auto w = randn(c.d, 72, 0.2f);
    for (auto& v : w) v += 1.f;
    round_bf16(w);
    std::vector<float> ref_y(c.T * c.d), ref_r(c.T);
    cpu->rmsnorm_forward(host(x, {c.T, c.d}), host(w, {c.d}), eps, host(ref_y, {c.T, c.d}), host(ref_r, {c.T}));
    auto gx = upload(*gpu, x, DType::BF16, {c.T, c.d});
    auto gw = upload(*gpu, w, DType::BF16, {c.d});
    DeviceTensor gy(*gpu, DType::BF16, {c.T, c.d});
    DeviceTensor gr(*gpu, DType::F32, {c.T});
    gpu->rmsnorm_forward(gx, gw, eps, gy, gr);
    auto y = download(*gpu, gy.t);
    auto r = download(*gpu, gr.t);
    EXPECT_CLOSE_REL(y, ref_y, 1e-2);
    EXPECT_CLOSE_REL(r, ref_r, 1e-6);
    // Host emulation of HF's rounding order: y = bf16(w * bf16(x * r)). With the device's own rstd it must
    // match bit for bit; with the CPU twin's rstd (fp64 statistics, may differ by an fp32 ulp) to 1 bf16 ulp.
    int64_t own_mismatches = 0, mismatches = 0, far = 0, single_rounding_diffs = 0;
    for (int64_t t = 0; t < c.T; ++t)
      for (int64_t j = 0; j < c.d; ++j) {
        const float xv = x[t * c.d + j], g = y[t * c.d + j];
        if (g != round_bf16(w[j] * round_bf16(xv * r[t]))) ++own_mismatches;
        const float e = round_bf16(w[j] * round_bf16(xv * ref_r[t]));
        if (g != e) ++mismatches;
        if (bf16_ulps(g, e) > 1) ++far;
        if (g != round_bf16(w[j] * (xv * r[t]))) ++single_rounding_diffs;
      }
    EXPECT_EQ(own_mismatches, 0) << "d=" << c.d;
    EXPECT_EQ(far, 0) << "elements more than 1 bf16 ulp from the HF emulation, d=" << c.d;
    EXPECT_LE(mismatches, std::max<int64_t>(1, c.T * c.d / 1000)) << "d=" << c.d;
    if (c.T * c.d >= 10000) {  // the double rounding is visible: a single rounding gives other bits somewhere
      EXPECT_GT(single_rounding_diffs, 0) << "d=" << c.d;
    }
  }
}

TEST(CudaBasicOps, RmsNormBackwardMatchesCpu) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  auto cpu = make_cpu_ops();
  const float eps = 1e-5f;
  struct Case { int64_t T, d; };
  for (const Case c : {Case{1, 64}, Case{7, 1000}, Case{1500, 512}, Case{64, 16384}, Case{3, 33}}) {
    auto x = rounded_randn(c.T * c.d, 81, 1.5f);
    auto dy = rounded_randn(c.T * c.d, 82);
    auto w = randn(c.d, 83, 0.2f);
    for (auto& v : w) v += 1.f;
    round_bf16(w);
    std::vector<float> y(c.T * c.d), rstd(c.T);
    cpu->rmsnorm_forward(host(x, {c.T, c.d}), host(w, {c.d}), eps, host(y, {c.T, c.d}), host(rstd, {c.T}));
    auto dw0 = randn(c.d, 84, 0.5f);
    std::vector<float> ref_dx(c.T * c.d), ref_dw(dw0);
    cpu->rmsnorm_backward(host(dy, {c.T, c.d}), host(x, {c.T, c.d}), host(w, {c.d}), host(rstd, {c.T}),
                          host(ref_dx, {c.T, c.d}), host(ref_dw, {c.d}));
    auto gdy = upload(*gpu, dy, DType::BF16, {c.T, c.d});
    auto gx = upload(*gpu, x, DType::BF16, {c.T, c.d});
    auto gw = upload(*gpu, w, DType::BF16, {c.d});
    auto gr = upload(*gpu, rstd, DType::F32, {c.T});
    auto gdx = upload(*gpu, randn(c.T * c.d, 85), DType::BF16, {c.T, c.d});  // overwritten
    std::vector<float> got_dw[2];
    std::vector<float> got_dx;
    for (auto& g : got_dw) {
      auto gdw = upload(*gpu, dw0, DType::F32, {c.d});
      gpu->rmsnorm_backward(gdy, gx, gw, gr, gdx, gdw);
      g = download(*gpu, gdw.t);
      got_dx = download(*gpu, gdx.t);
    }
    EXPECT_CLOSE_REL(got_dx, ref_dx, 1e-2);
    // dw is F32 from identical bf16 inputs: only the summation order differs from the fp64 twin.
    EXPECT_CLOSE_REL(got_dw[0], ref_dw, 1e-5);
    EXPECT_TRUE(bitwise_equal(got_dw[0], got_dw[1])) << "dw not deterministic, T=" << c.T;
  }
}

// The fused backward + residual add gives the bits of rmsnorm_backward into a scratch and add (the Ops default,
// which the CPU twin runs), with the vector and the element kernels.
TEST(CudaBasicOps, RmsNormBackwardAddIsBackwardThenAdd) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  auto cpu = make_cpu_ops();
  struct Case { int64_t T, d; };
  for (const Case c : {Case{37, 512}, Case{5, 33}, Case{600, 2048}}) {
    SCOPED_TRACE("T=" + std::to_string(c.T) + " d=" + std::to_string(c.d));
    auto x = rounded_randn(c.T * c.d, 91, 1.5f), dy = rounded_randn(c.T * c.d, 92), res = rounded_randn(c.T * c.d, 93);
    auto w = randn(c.d, 94, 0.2f);
    for (auto& v : w) v += 1.f;
    round_bf16(w);
    std::vector<float> y(c.T * c.d), rstd(c.T);
    cpu->rmsnorm_forward(host(x, {c.T, c.d}), host(w, {c.d}), 1e-5f, host(y, {c.T, c.d}), host(rstd, {c.T}));
    const auto dw0 = randn(c.d, 95, 0.5f);
    std::vector<float> ref_dx(res), ref_dw(dw0), tmp(c.T * c.d);
    cpu->rmsnorm_backward_add(host(dy, {c.T, c.d}), host(x, {c.T, c.d}), host(w, {c.d}), host(rstd, {c.T}),
                              host(ref_dx, {c.T, c.d}), host(ref_dw, {c.d}), host(tmp, {c.T, c.d}));
    auto gdy = upload(*gpu, dy, DType::BF16, {c.T, c.d});
    auto gx = upload(*gpu, x, DType::BF16, {c.T, c.d});
    auto gw = upload(*gpu, w, DType::BF16, {c.d});
    auto gr = upload(*gpu, rstd, DType::F32, {c.T});
    // the two ops
    auto two_dx = upload(*gpu, res, DType::BF16, {c.T, c.d}), two_dw = upload(*gpu, dw0, DType::F32, {c.d});
    DeviceTensor gtmp(*gpu, DType::BF16, {c.T, c.d});
    gpu->rmsnorm_backward(gdy, gx, gw, gr, gtmp, two_dw);
    gpu->add(two_dx, gtmp, two_dx);
    // fused
    auto one_dx = upload(*gpu, res, DType::BF16, {c.T, c.d}), one_dw = upload(*gpu, dw0, DType::F32, {c.d});
    DeviceTensor unused(*gpu, DType::BF16, {c.T, c.d});
    gpu->rmsnorm_backward_add(gdy, gx, gw, gr, one_dx, one_dw, unused);
    EXPECT_TRUE(bitwise_equal(download(*gpu, one_dx.t), download(*gpu, two_dx.t)));
    EXPECT_TRUE(bitwise_equal(download(*gpu, one_dw.t), download(*gpu, two_dw.t)));
    EXPECT_CLOSE_REL(download(*gpu, one_dx.t), ref_dx, 1e-2);
    EXPECT_CLOSE_REL(download(*gpu, one_dw.t), ref_dw, 1e-5);
  }
}

// ---- RoPE ----------------------------------------------------------------------------------------

// HF's bf16 arithmetic on the host: c, s = bf16(cos/sin of the fp32 angle); out = bf16(bf16(x1 c) -/+ bf16(x2 s)).
std::vector<float> rope_hf_emulation(const std::vector<float>& x, const std::vector<int32_t>& pos, int64_t T,
                                     int64_t H, int64_t D, float theta, float sign) {
  std::vector<float> out(x);
  const int64_t half = D / 2;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const float inv = 1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(D));
      const float a = static_cast<float>(pos[t]) * inv;
      const float c = round_bf16(static_cast<float>(std::cos(static_cast<double>(a))));
      const float s = sign * round_bf16(static_cast<float>(std::sin(static_cast<double>(a))));
      for (int64_t h = 0; h < H; ++h) {
        const int64_t b = (t * H + h) * D;
        const float x1 = x[b + i], x2 = x[b + i + half];
        out[b + i] = round_bf16(round_bf16(x1 * c) - round_bf16(x2 * s));
        out[b + i + half] = round_bf16(round_bf16(x2 * c) + round_bf16(x1 * s));
      }
    }
  return out;
}

TEST(CudaBasicOps, RopeForwardBackwardMatchCpu) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  auto cpu = make_cpu_ops();
  const float theta = 1e6f;
  struct Case { int64_t T, H, D; };
  // 16 heads of 128 (8x1B's q), 5 heads (a partial chunk of the vector kernel's 4), 8 pairs per half (one group)
  for (const Case c : {Case{1, 1, 64}, Case{300, 3, 64}, Case{257, 8, 128}, Case{5, 2, 2}, Case{9, 3, 24},
                       Case{130, 16, 128}, Case{33, 5, 128}, Case{70, 6, 16}}) {
    std::mt19937 rng(91 + static_cast<uint32_t>(c.D));
    std::uniform_int_distribution<int32_t> pd(0, 4095);
    std::vector<int32_t> pos(c.T);
    for (auto& p : pos) p = pd(rng);
    pos[0] = 4095;
    const int64_t n = c.T * c.H * c.D;
    auto x = rounded_randn(n, 92);
    auto gpos = upload_i32(*gpu, pos, {c.T});
    for (float sign : {1.f, -1.f}) {
      std::vector<float> ref(x);
      if (sign > 0)
        cpu->rope_forward(host(ref, {c.T, c.H, c.D}), host_i32(pos, {c.T}), theta);
      else
        cpu->rope_backward(host(ref, {c.T, c.H, c.D}), host_i32(pos, {c.T}), theta);
      auto gx = upload(*gpu, x, DType::BF16, {c.T, c.H, c.D});
      if (sign > 0)
        gpu->rope_forward(gx, gpos, theta);
      else
        gpu->rope_backward(gx, gpos, theta);
      auto got = download(*gpu, gx.t);
      EXPECT_CLOSE_REL(got, ref, 1e-2);
      // The same tensor 2 bytes off 16-byte alignment takes the scalar kernel: the same bits.
      std::vector<float> shifted(x);
      shifted.insert(shifted.begin(), 0.f);
      auto gs = upload(*gpu, shifted, DType::BF16, {n + 1});
      const Tensor off = gs.t.rows(1, n).view({c.T, c.H, c.D});
      if (sign > 0)
        gpu->rope_forward(off, gpos, theta);
      else
        gpu->rope_backward(off, gpos, theta);
      const auto got_scalar = download(*gpu, off);
      int64_t differ = 0;
      for (int64_t i = 0; i < n; ++i) differ += got_scalar[i] != got[i];
      EXPECT_EQ(differ, 0) << "D=" << c.D << " H=" << c.H << " sign=" << sign;
      auto emu = rope_hf_emulation(x, pos, c.T, c.H, c.D, theta, sign);
      int64_t mismatches = 0, far = 0;
      for (int64_t i = 0; i < n; ++i) {
        if (got[i] != emu[i]) ++mismatches;
        if (bf16_ulps(got[i], emu[i]) > 1) ++far;
      }
      // cos/sin here come from libm in fp64, on the device from sincosf: their bf16 roundings can differ
      // where the value sits within an fp32 ulp of a bf16 rounding boundary (rare).
      EXPECT_LE(far, std::max<int64_t>(2, n / 2000)) << "D=" << c.D << " sign=" << sign;
      EXPECT_LE(mismatches, std::max<int64_t>(2, n / 200)) << "D=" << c.D << " sign=" << sign;
    }
    // backward(forward(x)) is x up to bf16 rounding: the rotation is orthogonal.
    auto gx = upload(*gpu, x, DType::BF16, {c.T, c.H, c.D});
    gpu->rope_forward(gx, gpos, theta);
    gpu->rope_backward(gx, gpos, theta);
    EXPECT_CLOSE_REL(download(*gpu, gx.t), x, 1e-2);
  }
}

// ---- AdamW ---------------------------------------------------------------------------------------

// `offset` zeros, then a: a shard placed `offset` elements into its buffer (offset 1 misaligns the float4 path).
std::vector<float> after_zeros(const std::vector<float>& a, int64_t offset) {
  std::vector<float> b(offset, 0.f);
  b.insert(b.end(), a.begin(), a.end());
  return b;
}

// after_zeros(a, offset) on the device, as dtype t.
DeviceTensor upload_after(Ops& gpu, const std::vector<float>& a, DType t, int64_t offset) {
  return upload(gpu, after_zeros(a, offset), t, {static_cast<int64_t>(a.size()) + offset});
}

// Random AdamW operands of n elements from seeds seed .. seed + 3: parameter, gradient, and moments (v >= 0).
struct AdamWOperands {
  std::vector<float> p, g, m, v;
};
AdamWOperands adamw_operands(int64_t n, uint32_t seed) {
  AdamWOperands o{randn(n, seed), randn(n, seed + 1, 2.f), randn(n, seed + 2, 0.1f), randn(n, seed + 3, 0.1f)};
  for (auto& e : o.v) e = e * e;
  return o;
}
// A device buffer's elements from `offset` on.
std::vector<float> from_offset(Ops& gpu, const DeviceTensor& d, int64_t offset) {
  auto all = download(gpu, d.t);
  return std::vector<float>(all.begin() + offset, all.end());
}
// The update itself (p_new - p, about lr in size) must match the CPU twin's, not only the parameter.
void expect_same_update(const std::vector<float>& p0, const std::vector<float>& got, const std::vector<float>& ref) {
  std::vector<float> du_got(p0.size()), du_ref(p0.size());
  for (size_t i = 0; i < p0.size(); ++i) {
    du_got[i] = got[i] - p0[i];
    du_ref[i] = ref[i] - p0[i];
  }
  EXPECT_CLOSE_REL(du_got, du_ref, 1e-3);
}

TEST(CudaBasicOps, AdamWMatchesCpu) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  auto cpu = make_cpu_ops();
  AdamWStep s;
  s.lr = 3e-4f;
  s.beta1 = 0.9f;
  s.beta2 = 0.95f;
  s.eps = 1e-8f;
  s.weight_decay = 0.1f;
  s.step = 3;
  s.grad_scale = 0.5f;
  for (int64_t n : {int64_t{1000003}, int64_t{5}}) {
    for (int64_t offset : {0, 1}) {  // offset 1: misaligned for float4, exercising the scalar path
      auto [p, g, m, v] = adamw_operands(n, 101);
      std::vector<float> rp(p), rm(m), rv(v);
      cpu->adamw_step(host(rp, {n}), host(g, {n}), host(rm, {n}), host(rv, {n}), s);
      auto gp = upload_after(*gpu, p, DType::F32, offset), gg = upload_after(*gpu, g, DType::F32, offset);
      auto gm = upload_after(*gpu, m, DType::F32, offset), gv = upload_after(*gpu, v, DType::F32, offset);
      auto view = [&](const DeviceTensor& d) { return d.t.rows(offset, n); };
      gpu->adamw_step(view(gp), view(gg), view(gm), view(gv), s);
      auto tail = [&](const DeviceTensor& d) { return from_offset(*gpu, d, offset); };
      const auto got_p = tail(gp), got_m = tail(gm), got_v = tail(gv);
      EXPECT_CLOSE_REL(got_p, rp, 1e-6);
      EXPECT_CLOSE_REL(got_m, rm, 1e-6);
      EXPECT_CLOSE_REL(got_v, rv, 1e-6);
      expect_same_update(p, got_p, rp);
      EXPECT_GT(rel_l2(got_p, p), 1e-5);
      EXPECT_EQ(download(*gpu, gp.t).front(), offset ? 0.f : got_p.front());  // padding untouched
    }
  }
}

// BF16 moments (adamw_moments_dtype=bfloat16) against the CPU twin on the same bf16 values: the stored moments bit
// for bit (fp32 multiplies and adds, then one rounding to nearest even), the parameter as the F32 test requires;
// the float4 path (8-byte moment groups), the scalar path (a moment shard misaligned by one element) and the
// fused working copy.
TEST(CudaBasicOps, AdamWBf16MomentsMatchCpu) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  auto cpu = make_cpu_ops();
  AdamWStep s;
  s.lr = 3e-4f;
  s.weight_decay = 0.1f;
  s.step = 4;
  s.grad_scale = 0.6f;
  for (int64_t n : {int64_t{1000003}, int64_t{7}}) {
    for (int64_t offset : {0, 1}) {
      auto [p, g, m, v] = adamw_operands(n, 301);
      round_bf16(m);
      round_bf16(v);
      std::vector<uint16_t> mb(n), vb(n);
      for (int64_t i = 0; i < n; ++i) mb[i] = f32_to_bf16_bits(m[i]), vb[i] = f32_to_bf16_bits(v[i]);
      std::vector<float> rp(p);
      cpu->adamw_step(host(rp, {n}), host(g, {n}), Tensor(mb.data(), DType::BF16, {n}),
                      Tensor(vb.data(), DType::BF16, {n}), s);
      auto gp = upload_after(*gpu, p, DType::F32, offset), gg = upload_after(*gpu, g, DType::F32, offset);
      auto gm = upload_after(*gpu, m, DType::BF16, offset), gv = upload_after(*gpu, v, DType::BF16, offset);
      auto w = upload(*gpu, std::vector<float>(n + offset, -7.f), DType::BF16, {n + offset});
      auto view = [&](const DeviceTensor& d) { return d.t.rows(offset, n); };
      gpu->adamw_step_to(view(gp), view(gg), view(gm), view(gv), s, view(w));
      auto tail = [&](const DeviceTensor& d) { return from_offset(*gpu, d, offset); };
      const auto got_p = tail(gp), got_m = tail(gm), got_v = tail(gv), got_w = tail(w);
      EXPECT_CLOSE_REL(got_p, rp, 1e-6);
      int64_t m_diff = 0, v_diff = 0, w_diff = 0, moved = 0;
      for (int64_t i = 0; i < n; ++i) {
        m_diff += got_m[i] != bf16_bits_to_f32(mb[i]);
        v_diff += got_v[i] != bf16_bits_to_f32(vb[i]);
        w_diff += got_w[i] != round_bf16(got_p[i]);
        moved += got_m[i] != m[i];
      }
      EXPECT_EQ(m_diff, 0) << "n " << n << " offset " << offset;
      EXPECT_EQ(v_diff, 0) << "n " << n << " offset " << offset;
      EXPECT_EQ(w_diff, 0) << "n " << n << " offset " << offset;
      EXPECT_GT(moved, n / 2);
      expect_same_update(p, got_p, rp);
      if (offset) EXPECT_EQ(download(*gpu, gm.t).front(), 0.f);  // padding untouched
    }
  }
  // Moments of two dtypes are refused.
  DeviceTensor a(*gpu, DType::F32, {8}), b(*gpu, DType::BF16, {8});
  EXPECT_THROW(gpu->adamw_step(a.t, a.t, b.t, a.t, s), std::exception);
}

// A BF16 grad (expert_grad_dtype=bfloat16) is widened exactly: the step is bit for bit the one on an F32 grad
// holding the same values (param, moments, working copy), and follows the CPU twin as the F32 test requires; the
// float4 path (8-byte grad groups) and the scalar path (misaligned by one element).
TEST(CudaBasicOps, AdamWBf16GradIsTheF32StepOnItsValues) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  auto cpu = make_cpu_ops();
  AdamWStep s;
  s.lr = 2e-4f;
  s.weight_decay = 0.05f;
  s.step = 5;
  s.grad_scale = 0.7f;
  for (int64_t n : {int64_t{1000003}, int64_t{6}}) {
    for (int64_t offset : {0, 1}) {
      SCOPED_TRACE("n " + std::to_string(n) + " offset " + std::to_string(offset));
      auto [p, g, m, v] = adamw_operands(n, 401);
      round_bf16(g);
      std::vector<float> rp(p), rm(m), rv(v);
      cpu->adamw_step(host(rp, {n}), host(g, {n}), host(rm, {n}), host(rv, {n}), s);
      auto view = [&](const DeviceTensor& d) { return d.t.rows(offset, n); };
      auto tail = [&](const DeviceTensor& d) { return from_offset(*gpu, d, offset); };
      std::vector<std::vector<float>> out[2];
      for (DType gt : {DType::F32, DType::BF16}) {
        auto gp = upload_after(*gpu, p, DType::F32, offset), gg = upload_after(*gpu, g, gt, offset);
        auto gm = upload_after(*gpu, m, DType::F32, offset), gv = upload_after(*gpu, v, DType::F32, offset);
        auto w = upload(*gpu, std::vector<float>(n + offset, -3.f), DType::BF16, {n + offset});
        gpu->adamw_step_to(view(gp), view(gg), view(gm), view(gv), s, view(w));
        out[gt == DType::BF16] = {tail(gp), tail(gm), tail(gv), tail(w)};
      }
      for (int k = 0; k < 4; ++k) EXPECT_EQ(out[1][k], out[0][k]) << "operand " << k;
      EXPECT_CLOSE_REL(out[1][0], rp, 1e-6);
      EXPECT_CLOSE_REL(out[1][1], rm, 1e-6);
      expect_same_update(p, out[1][0], rp);
      EXPECT_GT(rel_l2(out[1][0], p), 1e-5);
    }
  }
}

// The fused step writes the working copy as the separate copy would, bit for bit: bf16 and f32 copies, a copy shorter
// than the master (its padding), a misaligned shard (the scalar path), the float4 path's tail, and a working copy
// misaligned against an aligned master (the float4 path's element-by-element stores).
TEST(CudaBasicOps, AdamWStepToWritesTheWorkingCopyAsACopyWould) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  AdamWStep s;
  s.lr = 1e-3f;
  s.weight_decay = 0.1f;
  s.step = 7;
  s.grad_scale = 0.8f;
  for (DType wt : {DType::BF16, DType::F32}) {
    for (auto [offset, woff] : {std::pair<int64_t, int64_t>{0, 0}, {3, 0}, {0, 1}}) {
      const int64_t n = 100003, wn = n - 5;  // the last 5 elements: padding without a working copy
      auto p = randn(n + offset, 201), g = randn(n + offset, 202), m = randn(n + offset, 203, 0.1f);
      auto v = randn(n + offset, 204, 0.1f);
      for (auto& e : v) e = e * e;
      auto run = [&](bool fused) {
        auto gp = upload(*gpu, p, DType::F32, {n + offset}), gg = upload(*gpu, g, DType::F32, {n + offset});
        auto gm = upload(*gpu, m, DType::F32, {n + offset}), gv = upload(*gpu, v, DType::F32, {n + offset});
        auto w = upload(*gpu, std::vector<float>(wn + offset + woff, -7.f), wt, {wn + offset + woff});
        auto at = [&](const DeviceTensor& d, int64_t len) { return d.t.rows(offset, len); };
        const Tensor wv = w.t.rows(offset + woff, wn);
        if (fused) {
          gpu->adamw_step_to(at(gp, n), at(gg, n), at(gm, n), at(gv, n), s, wv);
        } else {
          gpu->adamw_step(at(gp, n), at(gg, n), at(gm, n), at(gv, n), s);
          gpu->copy(at(gp, wn), wv);
        }
        return std::make_pair(download(*gpu, gp.t), download(*gpu, w.t));
      };
      const auto [p_fused, w_fused] = run(true);
      const auto [p_ref, w_ref] = run(false);
      EXPECT_EQ(p_fused, p_ref) << dtype_name(wt) << " offset " << offset << " working offset " << woff;
      EXPECT_EQ(w_fused, w_ref) << dtype_name(wt) << " offset " << offset << " working offset " << woff;
      EXPECT_GT(rel_l2(p_fused, p), 1e-6);  // the step moved the master
      for (int64_t i = 0; i < offset + woff; ++i) EXPECT_EQ(w_fused[i], -7.f);  // before the shard: untouched
    }
  }
  // A working copy longer than the master is refused.
  DeviceTensor a(*gpu, DType::F32, {8}), b(*gpu, DType::BF16, {9});
  EXPECT_THROW(gpu->adamw_step_to(a.t, a.t, a.t, a.t, s, b.t), std::exception);
}

}  // namespace
}  // namespace mxt::testing
