// CUDA lm_head_loss against its CPU twin on identical bf16-rounded h and W.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "ce_rows_sm90.hpp"
#include "cuda_test_util.hpp"

namespace mxt::testing {
namespace {

struct LmCase {
  int64_t T, V, d;
};

// Labels uniform over the vocabulary, about 1 in 8 ignored (-100), and the first `ignored_prefix` all ignored
// (so a whole run of rows, possibly a whole chunk's start, has no loss).
std::vector<int32_t> make_labels(int64_t T, int64_t V, uint32_t seed, int64_t ignored_prefix = 0) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> tok(0, V - 1);
  std::uniform_int_distribution<int> coin(0, 7);
  std::vector<int32_t> lab(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t)
    lab[t] = (t < ignored_prefix || coin(rng) == 0) ? -100 : static_cast<int32_t>(tok(rng));
  return lab;
}

void check_lm_head(const LmCase& c, bool with_grad, uint32_t seed, int64_t ignored_prefix = 0) {
  SCOPED_TRACE("T=" + std::to_string(c.T) + " V=" + std::to_string(c.V) + " d=" + std::to_string(c.d) +
               (with_grad ? " with grad" : " loss only"));
  auto gpu = make_cuda_ops();
  auto cpu = make_cpu_ops();
  const int64_t T = c.T, V = c.V, d = c.d;
  std::vector<float> h = randn(T * d, seed), W = randn(V * d, seed + 1, 0.05f);  // logits ~ N(0, 0.8^2)
  round_bf16(h);
  round_bf16(W);
  std::vector<int32_t> labels = make_labels(T, V, seed + 2, ignored_prefix);
  int64_t valid = 0;
  for (int32_t y : labels) valid += y != -100;
  ASSERT_GT(valid, 0);
  const float grad_scale = 1.f / static_cast<float>(valid);
  const float loss0 = 1.5f;  // loss_sum accumulates
  const std::vector<float> dW0 = randn(V * d, seed + 3, 0.01f);  // dW accumulates

  std::vector<float> loss_ref = {loss0}, dh_ref(with_grad ? T * d : 0), dW_ref = dW0;
  cpu->lm_head_loss(host(h, {T, d}), host(W, {V, d}), host_i32(labels, {T}), grad_scale, host(loss_ref, {1}),
                    with_grad ? host(dh_ref, {T, d}) : Tensor(), with_grad ? host(dW_ref, {V, d}) : Tensor());

  DeviceTensor gh = upload(*gpu, h, DType::BF16, {T, d}), gW = upload(*gpu, W, DType::BF16, {V, d});
  DeviceTensor glab = upload_i32(*gpu, labels, {T}), gloss = upload(*gpu, {loss0}, DType::F32, {1});
  DeviceTensor gdh = upload(*gpu, randn(T * d, seed + 4), DType::BF16, {T, d});  // stale: overwritten
  DeviceTensor gdW = upload(*gpu, dW0, DType::F32, {V, d});
  gpu->lm_head_loss(gh, gW, glab, grad_scale, gloss, with_grad ? gdh.t : Tensor(), with_grad ? gdW.t : Tensor());

  // The twin uses fp32 logits; here they are rounded to bf16 (as HF does) before the fp32 softmax, which moves
  // each token's loss by about |logit| * 2^-9 with a random sign. Measured on an H200 for these shapes: relative
  // error of the summed loss 1.5e-6 .. 2e-5; 1e-3 is the bound.
  const double got_loss = download(*gpu, gloss)[0] - double(loss0), ref_loss = loss_ref[0] - double(loss0);
  std::printf("[ measured ] lm_head T=%ld V=%ld: loss rel err %.3g\n", static_cast<long>(T), static_cast<long>(V),
              std::abs(got_loss - ref_loss) / std::abs(ref_loss));
  EXPECT_NEAR(got_loss, ref_loss, 1e-3 * std::abs(ref_loss)) << "loss " << got_loss << " vs " << ref_loss;
  if (!with_grad) {
    EXPECT_EQ(download(*gpu, gdW), dW0) << "dW must be untouched without a gradient";
    return;
  }
  // bf16 logits and a bf16 logit gradient feed the two GEMMs. Measured on an H200: dh rel L2 2.1e-3 .. 3.7e-3,
  // dW 1.3e-3 .. 3.3e-3; 2e-2 is the bound.
  const auto dh = download(*gpu, gdh);
  EXPECT_CLOSE_REL(dh, dh_ref, 2e-2);
  for (int64_t t = 0; t < T; ++t) {
    if (labels[t] != -100) continue;
    for (int64_t j = 0; j < d; ++j) ASSERT_EQ(dh[t * d + j], 0.f) << "ignored row " << t << " must get zero dh";
  }
  // Compare the accumulated increments, not the totals (dW0 would hide an error in the increment).
  const auto dW = download(*gpu, gdW);
  std::vector<float> inc(V * d), inc_ref(V * d);
  for (int64_t i = 0; i < V * d; ++i) {
    inc[i] = dW[i] - dW0[i];
    inc_ref[i] = dW_ref[i] - dW0[i];
  }
  EXPECT_CLOSE_REL(inc, inc_ref, 2e-2);
  std::printf("[ measured ] lm_head T=%ld V=%ld: dh rel L2 %.3g, dW rel L2 %.3g\n", static_cast<long>(T),
              static_cast<long>(V), rel_l2(dh, dh_ref), rel_l2(inc, inc_ref));
}

TEST(CudaLmHead, SmallVocab) {
  MXT_REQUIRE_GPU();
  check_lm_head({64, 1000, 256}, true, 10);
  check_lm_head({300, 1000, 256}, true, 20, /*ignored_prefix=*/17);
  check_lm_head({77, 1000, 256}, false, 30);
  check_lm_head({40, 1001, 64}, true, 35);  // V % 8 != 0: the scalar cross-entropy kernel
}

// Llama-3 vocabulary: 600 rows span two chunks (512 + 88) of the chunked loop.
TEST(CudaLmHead, LargeVocab) {
  MXT_REQUIRE_GPU();
  check_lm_head({600, 128256, 256}, true, 40);
  check_lm_head({131, 128256, 256}, false, 50);
}

// MXTRAIN_CE_ROWS: both forms of the pass (the default 4-CTA clusters holding each row in shared memory,
// ce_rows_sm90.cu, and the per-row kernel) against the CPU twin as above (ignored rows, a whole ignored prefix, two
// chunks, loss only), and against each other on the same logits: the losses to fp32 summation order, the gradients
// to one bf16 rounding step.
TEST(CudaLmHead, ClusterRowsMatchTheRowKernel) {
  MXT_REQUIRE_GPU();
  for (const char* m : {"cluster", "row"}) {
    ScopedEnv rows("MXTRAIN_CE_ROWS", m);
    check_lm_head({64, 1000, 256}, true, 110);
    check_lm_head({300, 1000, 256}, true, 120, /*ignored_prefix=*/17);
    check_lm_head({600, 128256, 256}, true, 140);
    check_lm_head({131, 128256, 256}, false, 150);
    check_lm_head({9, 24, 64}, true, 160);  // 3 vectors per row: the 4th CTA has none
    // the form asked for ran (the cluster one where the device runs sm_90a code), not a fallback
    const bool cluster = std::string(m) == "cluster" && device_is_sm90();
    EXPECT_STREQ(cuda::last_ce_rows_impl(), cluster ? "cluster" : "row") << "MXTRAIN_CE_ROWS=" << m;
  }
  auto gpu = make_cuda_ops();
  const int64_t T = 96, V = 128256, d = 128;
  const auto h = randn(T * d, 170), W = randn(V * d, 171, 0.05f);
  const auto labels = make_labels(T, V, 172, 5);
  DeviceTensor gh = upload(*gpu, h, DType::BF16, {T, d}), gW = upload(*gpu, W, DType::BF16, {V, d});
  DeviceTensor glab = upload_i32(*gpu, labels, {T});
  std::vector<float> loss[2], dlogits[2];
  const char* mode[2] = {"row", "cluster"};
  for (int i = 0; i < 2; ++i) {
    ScopedEnv rows("MXTRAIN_CE_ROWS", mode[i]);
    DeviceTensor gloss = upload(*gpu, {0.f}, DType::F32, {1}), gdh(*gpu, DType::BF16, {T, d});
    DeviceTensor gz(*gpu, DType::BF16, {T, V});
    gpu->lm_head_loss(gh, gW, glab, 0.25f, gloss, gdh, Tensor(), gz);
    loss[i] = download(*gpu, gloss);
    dlogits[i] = download(*gpu, gz);
  }
  EXPECT_NEAR(loss[1][0], loss[0][0], 1e-5 * std::abs(loss[0][0]));
  int64_t far = 0;
  for (size_t i = 0; i < dlogits[0].size(); ++i) far += bf16_ulps(dlogits[1][i], dlogits[0][i]) > 1;
  EXPECT_EQ(far, 0) << "logit gradients more than one bf16 step from the per-row kernel's";
  {
    ScopedEnv bad("MXTRAIN_CE_ROWS", "clusters");
    DeviceTensor gloss = upload(*gpu, {0.f}, DType::F32, {1}), gdh(*gpu, DType::BF16, {T, d});
    DeviceTensor gz(*gpu, DType::BF16, {T, V});
    EXPECT_THROW(gpu->lm_head_loss(gh, gW, glab, 0.25f, gloss, gdh, Tensor(), gz), std::exception);
  }
}

// A label outside the vocabulary (and not -100) cannot raise on the device: it must poison the loss with NaN
// rather than read out of bounds or be silently skipped.
TEST(CudaLmHead, BadLabelGivesNaN) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  const int64_t T = 4, V = 50, d = 32;
  DeviceTensor gh = upload(*gpu, randn(T * d, 60), DType::BF16, {T, d});
  DeviceTensor gW = upload(*gpu, randn(V * d, 61, 0.1f), DType::BF16, {V, d});
  DeviceTensor glab = upload_i32(*gpu, {3, static_cast<int32_t>(V + 5), -100, 7}, {T});
  DeviceTensor gloss(*gpu, DType::F32, {1});
  DeviceTensor gdh(*gpu, DType::BF16, {T, d}), gdW(*gpu, DType::F32, {V, d});
  gpu->lm_head_loss(gh, gW, glab, 0.5f, gloss, gdh, gdW);
  EXPECT_TRUE(std::isnan(download(*gpu, gloss)[0]));
  const auto dh = download(*gpu, gdh);
  for (int64_t j = 0; j < d; ++j) EXPECT_EQ(dh[1 * d + j], 0.f);
}

// lm_head_wgrad_micro_batches: two micro-batches with their logit gradients kept (dlogits), then one cuBLASLt GEMM
// over both, against the plain op twice: the same loss, dh (same chunk: T is below the chunk size) and dW to fp32
// summation order. The kept calls leave dW alone.
TEST(CudaLmHead, KeptLogitGradientsThenOneWeightGradient) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  const int64_t T = 600, V = 50304, d = 256;
  std::vector<float> W = randn(V * d, 70, 0.05f), dW0 = randn(V * d, 71, 0.01f);
  DeviceTensor gW = upload(*gpu, W, DType::BF16, {V, d});
  DeviceTensor plain = upload(*gpu, dW0, DType::F32, {V, d}), kept = upload(*gpu, dW0, DType::F32, {V, d});
  DeviceTensor loss_plain = upload(*gpu, {0.f}, DType::F32, {1}), loss_kept = upload(*gpu, {0.f}, DType::F32, {1});
  DeviceTensor dz(*gpu, DType::BF16, {2 * T, V}), hh(*gpu, DType::BF16, {2 * T, d});
  for (int m = 0; m < 2; ++m) {
    std::vector<float> h = randn(T * d, 72 + m);
    round_bf16(h);
    DeviceTensor gh = upload(*gpu, h, DType::BF16, {T, d});
    DeviceTensor glab = upload_i32(*gpu, make_labels(T, V, 74 + m), {T});
    DeviceTensor dh_plain(*gpu, DType::BF16, {T, d}), dh_kept(*gpu, DType::BF16, {T, d});
    gpu->lm_head_loss(gh, gW, glab, 0.01f, loss_plain, dh_plain, plain);
    gpu->lm_head_loss(gh, gW, glab, 0.01f, loss_kept, dh_kept, Tensor(), dz.t.rows(m * T, T));
    // Equal unless cuBLASLt picks another algorithm for the other buffer: then one bf16 rounding apart.
    EXPECT_LT(rel_l2(download(*gpu, dh_kept), download(*gpu, dh_plain)), 4e-3) << "micro-batch " << m;
    gpu->copy(gh, hh.t.rows(m * T, T));
  }
  EXPECT_EQ(download(*gpu, loss_plain)[0], download(*gpu, loss_kept)[0]);
  EXPECT_EQ(download(*gpu, kept), dW0) << "the kept calls touched dW";
  gpu->gemm(true, false, V, d, 2 * T, 1.f, dz, hh, 1.f, kept);
  const std::vector<float> plain_dW = download(*gpu, plain);
  EXPECT_LT(rel_l2(download(*gpu, kept), plain_dW), 1e-5);
  EXPECT_GT(rel_l2(dW0, plain_dW), 1e-3);  // the gradient is not negligible against dW0
}

}  // namespace
}  // namespace mxt::testing
