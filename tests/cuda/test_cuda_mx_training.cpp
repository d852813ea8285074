// MXFP8 in training on CUDA against the CPU twin: the expert MLP forward + backward (uneven loads, one empty
// expert, a padded token tail), a dense MXFP8 linear, and a short fp8 training run. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "cuda_test_util.hpp"
#include "model/mx_linear.hpp"
#include "mx_experts_test_util.hpp"
#include "tiny_config.hpp"
#include "mxtrain/data.hpp"
#include "mxtrain/trainer.hpp"

namespace mxt::testing {
namespace {

class CudaMxExperts : public ::testing::TestWithParam<mxfp8::Format> {};

TEST_P(CudaMxExperts, ForwardBackwardMatchTheCpuTwin) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  auto cpu = make_cpu_ops();
  const MxExpertProblem p({70, 0, 9, 133, 1, 45}, 21);  // 258 rows -> 288; an empty and a one-row expert
  MxExpertBuffers g(*gpu, p, GetParam()), c(*cpu, p, GetParam());
  g.forward_backward(*gpu);
  c.forward_backward(*cpu);
  auto cmp = [&](const char* what, const Tensor& tg, const Tensor& tc, double l2_tol, double worst_tol) {
    const std::vector<float> a = MxExpertBuffers::get(*gpu, tg), b = MxExpertBuffers::get(*cpu, tc);
    const double l2 = mx_rel_l2(a, b), worst = mx_rel_worst(a, b);
    std::printf("  %-5s rel L2 %.2e  worst (of max) %.2e\n", what, l2, worst);
    EXPECT_LT(l2, l2_tol) << what;
    EXPECT_LT(worst, worst_tol) << what;
  };
  // h13: identical quantised operands (bf16-exact inputs), so only summation order and the bf16 output differ.
  cmp("h13", g.h13, c.h13, 5e-3, 2e-2);
  // Later operands are quantised from bf16 (CUDA) vs fp32 (CPU) intermediates: a few percent of the codes
  // differ by one FP8 step (6-12%), which shows as ~1-2% norm-wise.
  cmp("y", g.y, c.y, 4e-2, 0.25);
  cmp("dx", g.dx, c.dx, 5e-2, 0.25);
  cmp("dwp", g.dwp, c.dwp, 5e-2, 0.25);
  cmp("dw13", g.dw13, c.dw13, 5e-2, 0.25);
  cmp("dw2", g.dw2, c.dw2, 5e-2, 0.25);
  const std::vector<float> dw13 = MxExpertBuffers::get(*gpu, g.dw13);  // expert 1 is empty
  for (int64_t i = 2 * p.f * p.d; i < 4 * p.f * p.d; ++i) ASSERT_EQ(dw13[i], 0.f);
}

INSTANTIATE_TEST_SUITE_P(Formats, CudaMxExperts, ::testing::Values(mxfp8::Format::E4M3, mxfp8::Format::E5M2),
                         [](const auto& info) { return std::string(mxfp8::format_name(info.param)); });

// A dense projection as a one-group MXFP8 GEMM (offsets {0, T}): forward, dgrad (accumulating), wgrad.
TEST(CudaMxDense, LinearMatchesTheCpuTwin) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  auto cpu = make_cpu_ops();
  const int64_t T = 96, in = 128, out = 64;
  // bf16-representable inputs: the CUDA side quantises from bf16 and the CPU twin from fp32, so only exact
  // bf16 values give both the same FP8 codes.
  auto exact = [](std::vector<float> v) {
    for (float& e : v) e = MxExpertProblem::bf16(e);
    return v;
  };
  const std::vector<float> x = exact(randn(T * in, 1)), w = exact(randn(out * in, 2, 0.1f)),
                           dy = exact(randn(T * out, 3, 1e-2f)), dx0 = exact(randn(T * in, 4, 1e-3f));
  struct Side {
    Arena arena;
    MxWeight W;
    MxDense m;
    MxBuf xc;
    Tensor tx, tw, tdy, tdx, ttmp, tdw, ty, toff;
  };
  auto setup = [&](Ops& ops, Side& s) {
    const DType A = ops.act_dtype();
    s.W.plan(s.arena, "w", 1, out, in);
    s.m.a.plan(s.arena, "a", T * in);
    s.m.b.plan(s.arena, "b", T * in);
    s.xc.plan(s.arena, "xc", T * in);
    s.arena.add(s.tx, "x", A, {T, in});
    s.arena.add(s.tw, "w", A, {out, in});
    s.arena.add(s.tdy, "dy", A, {T, out});
    s.arena.add(s.tdx, "dx", A, {T, in});
    s.arena.add(s.ttmp, "tmp", A, {T, in});
    s.arena.add(s.ty, "y", A, {T, out});
    s.arena.add(s.tdw, "dw", DType::F32, {out, in});
    s.arena.add(s.toff, "off", DType::I32, {2});
    s.arena.finalize(ops);
    const int32_t off[2] = {0, static_cast<int32_t>(T)};
    ops.upload(s.toff.data, off, sizeof(off));
    MxExpertBuffers::put(ops, s.tx, x, 0.f);
    MxExpertBuffers::put(ops, s.tw, w, 0.f);
    MxExpertBuffers::put(ops, s.tdy, dy, 0.f);
    MxExpertBuffers::put(ops, s.tdx, dx0, 0.f);
    s.m.offsets = s.toff;
    s.m.T = T;
    s.m.grad = mxfp8::Format::E5M2;
    mx_quantize_weight(ops, s.tw, s.W);
    mx_linear_forward(ops, s.m, mx_dense_rowwise(ops, s.m, s.tx, s.m.a), s.W, s.ty);
    mx_linear_backward(ops, s.m, s.tdy, s.W, mx_dense_colwise(ops, s.m, s.tx, s.xc), s.tdx, s.ttmp, s.tdw);
    ops.synchronize();
  };
  Side g, c;
  setup(*gpu, g);
  setup(*cpu, c);
  EXPECT_LT(mx_rel_l2(MxExpertBuffers::get(*gpu, g.ty), MxExpertBuffers::get(*cpu, c.ty)), 5e-3);
  EXPECT_LT(mx_rel_l2(MxExpertBuffers::get(*gpu, g.tdx), MxExpertBuffers::get(*cpu, c.tdx)), 5e-3);
  // 5e-4, not fp32-tight: Hopper's FP8 wgmma rounds its 32-product partial sums toward zero (the sm90 kernel's
  // tests measure up to 4.4e-4 of sum |ab|).
  EXPECT_LT(mx_rel_l2(MxExpertBuffers::get(*gpu, g.tdw), MxExpertBuffers::get(*cpu, c.tdw)), 5e-4);
}

// The tiny L0 shape for 10 steps with fp8_config.enabled on both backends: the losses track each other.
TEST(CudaMxTraining, TinyL0Fp8TracksTheCpuTwin) {
  MXT_REQUIRE_GPU();
  TrainConfig c = testing::tiny_config("mxtrain_test_cuda_fp8", 64, 128);
  c.num_train_steps = 10;
  c.lr_scheduler = {3, 7, 0.1};
  c.fp8.enabled = true;
  c.fp8.fp8_format = "HYBRID";
  auto gpu = make_cuda_ops();
  auto cpu = make_cpu_ops();
  std::vector<double> lg, lc;
  {
    Trainer t(c, *gpu, embedded_corpus_tokens());
    lg = t.run();
  }
  {
    Trainer t(c, *cpu, embedded_corpus_tokens());
    lc = t.run();
  }
  ASSERT_EQ(lg.size(), lc.size());
  for (size_t i = 0; i < lg.size(); ++i) {
    std::printf("  step %zu: cuda %.4f cpu %.4f\n", i + 1, lg[i], lc[i]);
    EXPECT_NEAR(lg[i], lc[i], 0.03 * lc[i]) << "step " << i + 1;
  }
  EXPECT_LT(lg.back(), lg.front());
}

// fp8_config.hopper_gemm=bf16 on the GPU: the MXFP8 GEMMs as bf16 GEMMs on the dequantised operands (the same
// quantised values as the FP8 wgmma kernels, summed in full fp32 where FP8 wgmma truncates its partial sums): the
// losses track the FP8 kernels' and the CPU twin's, with and without MXFP8 attention; per-layer columnwise weight
// copies give the same bits.
TEST(CudaMxTraining, HopperGemmBf16TracksTheFp8Kernels) {
  MXT_REQUIRE_GPU();
  for (const bool keep_attn : {false, true}) {
    TrainConfig c = testing::tiny_config("mxtrain_test_cuda_hopper_bf16", 64, 128);
    c.num_train_steps = 10;
    c.lr_scheduler = {3, 7, 0.1};
    c.fp8.enabled = true;
    c.fp8.fp8_format = "HYBRID";
    c.fp8.keep_attention_bf16 = keep_attn;
    auto gpu = make_cuda_ops();
    auto cpu = make_cpu_ops();
    auto run = [&](Ops& ops, const TrainConfig& cfg) {
      Trainer t(cfg, ops, embedded_corpus_tokens());
      return t.run();
    };
    c.fp8.hopper_gemm = "fp8";  // the FP8 wgmma kernels (bf16 is the default)
    const std::vector<double> fp8 = run(*gpu, c), twin = run(*cpu, c);
    c.fp8.hopper_gemm = "bf16";
    const std::vector<double> bf16 = run(*gpu, c);
    c.fp8.cache_columnwise_weights = false;
    const std::vector<double> per_layer = run(*gpu, c);
    ASSERT_EQ(fp8.size(), bf16.size());
    for (size_t i = 0; i < fp8.size(); ++i) {
      std::printf("  keep_attention_bf16 %d step %zu: fp8 kernels %.4f, bf16 GEMMs %.4f, cpu %.4f\n", keep_attn, i + 1,
                  fp8[i], bf16[i], twin[i]);
      EXPECT_NEAR(bf16[i], fp8[i], 0.02 * fp8[i]) << "step " << i + 1;
      EXPECT_NEAR(bf16[i], twin[i], 0.03 * twin[i]) << "step " << i + 1;
      EXPECT_EQ(per_layer[i], bf16[i]) << "per-layer copies, step " << i + 1;
    }
    EXPECT_LT(bf16.back(), bf16.front());
  }
}

// recompute_experts on the GPU, bf16 and MXFP8: the backward's rebuilt h13 / SwiGLU output (and its columnwise
// copy) are the forward's bits, so the losses equal the run that kept them (the CUDA path is deterministic); so
// do MXFP8's per-layer columnwise weight copies (fp8_config.cache_columnwise_weights=false, L1_8x7B_ep's setting).
TEST(CudaMxTraining, RecomputeExpertsGivesTheSameLosses) {
  MXT_REQUIRE_GPU();
  for (const bool fp8 : {false, true}) {
    TrainConfig c = testing::tiny_config("mxtrain_test_cuda_recompute", 64, 128);
    c.num_train_steps = 6;
    c.lr_scheduler = {2, 4, 0.1};
    c.fp8.enabled = fp8;
    std::vector<double> kept, rebuilt;
    auto gpu = make_cuda_ops();
    {
      Trainer t(c, *gpu, embedded_corpus_tokens());
      kept = t.run();
    }
    c.recompute_experts = true;
    {
      Trainer t(c, *gpu, embedded_corpus_tokens());
      rebuilt = t.run();
    }
    ASSERT_EQ(kept.size(), rebuilt.size());
    for (size_t i = 0; i < kept.size(); ++i) EXPECT_EQ(kept[i], rebuilt[i]) << "fp8 " << fp8 << ", step " << i + 1;
    if (!fp8) continue;
    c.fp8.cache_columnwise_weights = false;
    std::vector<double> per_layer;
    {
      Trainer t(c, *gpu, embedded_corpus_tokens());
      per_layer = t.run();
    }
    ASSERT_EQ(kept.size(), per_layer.size());
    for (size_t i = 0; i < kept.size(); ++i) EXPECT_EQ(kept[i], per_layer[i]) << "per-layer copies, step " << i + 1;
  }
}

}  // namespace
}  // namespace mxt::testing
