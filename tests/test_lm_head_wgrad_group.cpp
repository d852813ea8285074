// lm_head_wgrad_micro_batches G: each micro-batch of a group leaves its LM-head logit gradients (and final hidden
// states) in held buffers, and the group's last one adds dW += dlogits^T h over all of them in one GEMM. The op
// side (lm_head_loss with a dlogits output) is checked against the plain op; training against G = 1, which differs
// only in the fp32 summation order of the LM head's weight gradient.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "config_error.hpp"
#include "host_test_util.hpp"
#include "tiny_config.hpp"
#include "trained_run.hpp"
#include "mxtrain/config.hpp"
#include "mxtrain/data.hpp"
#include "mxtrain/model.hpp"
#include "mxtrain/ops.hpp"
#include "mxtrain/params.hpp"
#include "mxtrain/trainer.hpp"

namespace mxt::testing {
namespace {

FVec random(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  return uniform(n, rng, -scale, scale);
}

// Two micro-batches through the op with dlogits kept, then one GEMM over both, against the plain op run twice:
// the same losses and dh bit for bit, dW to fp32 summation order; ignored labels keep a zero gradient row.
TEST(LmHeadWgradGroup, OpLeavesTheLogitGradients) {
  auto ops = make_cpu_ops();
  const int64_t T = 70, V = 53, d = 24;  // T past the CPU op's 64-row chunk
  std::vector<float> W = random(V * d, 1, 0.3f), dW0 = random(V * d, 2, 0.1f);
  std::vector<float> h[2] = {random(T * d, 3, 1.f), random(T * d, 4, 1.f)};
  std::vector<int32_t> labels[2];
  for (int m = 0; m < 2; ++m)
    for (int64_t t = 0; t < T; ++t) labels[m].push_back(t % 11 == 3 ? -100 : static_cast<int32_t>((t * 7 + m) % V));

  std::vector<float> dW_plain = dW0, dW_kept = dW0, loss_plain(1, 0.f), loss_kept(1, 0.f);
  std::vector<float> dz(2 * T * V, 0.f), hh(2 * T * d);
  for (int m = 0; m < 2; ++m) {
    const Tensor lab(labels[m].data(), DType::I32, {T});
    std::vector<float> dh_plain(T * d), dh_kept(T * d);
    ops->lm_head_loss(F(h[m], {T, d}), F(W, {V, d}), lab, 0.25f, F(loss_plain, {1}), F(dh_plain, {T, d}),
                      F(dW_plain, {V, d}));
    const Tensor dzm(dz.data() + m * T * V, DType::F32, {T, V});
    ops->lm_head_loss(F(h[m], {T, d}), F(W, {V, d}), lab, 0.25f, F(loss_kept, {1}), F(dh_kept, {T, d}), Tensor(),
                      dzm);
    EXPECT_EQ(dh_plain, dh_kept) << "micro-batch " << m;
    std::copy(h[m].begin(), h[m].end(), hh.begin() + m * T * d);
    for (int64_t t = 0; t < T; ++t)
      if (labels[m][t] == -100)
        for (int64_t v = 0; v < V; ++v) ASSERT_EQ(dz[(m * T + t) * V + v], 0.f);
  }
  EXPECT_EQ(loss_plain[0], loss_kept[0]);
  EXPECT_EQ(dW_kept, dW0) << "the kept call touched dW";
  ops->gemm(true, false, V, d, 2 * T, 1.f, F(dz, {2 * T, V}), F(hh, {2 * T, d}), 1.f, F(dW_kept, {V, d}));
  EXPECT_LT(rel_l2(dW_kept, dW_plain), 1e-6);
  EXPECT_GT(rel_l2(dW_plain, dW0), 1e-3);  // the gradient is not negligible against dW0

  std::vector<float> dz1(T * V);
  EXPECT_THROW(ops->lm_head_loss(F(h[0], {T, d}), F(W, {V, d}), Tensor(labels[0].data(), DType::I32, {T}), 1.f,
                                 F(loss_kept, {1}), Tensor(), Tensor(), F(dz1, {T, V})),
               std::exception);  // dlogits without the backward
  std::vector<float> dh(T * d), small(T * (V - 1));
  EXPECT_THROW(ops->lm_head_loss(F(h[0], {T, d}), F(W, {V, d}), Tensor(labels[0].data(), DType::I32, {T}), 1.f,
                                 F(loss_kept, {1}), F(dh, {T, d}), Tensor(), F(small, {T, V - 1})),
               std::exception);  // wrong shape
}

TrainConfig config(int64_t group, int64_t acc) {
  TrainConfig c = five_step_config("mxtrain_test_lm_head_wgrad_group", acc);
  c.lm_head_wgrad_micro_batches = group;
  return c;
}

// Groups that divide the step, that do not (a short last group), larger than the step, and one micro-batch per
// step; with the expert gradients grouped too. The first step's loss is computed before any update, so it is equal
// bit for bit; after that only the LM head gradient's summation order differs.
TEST(LmHeadWgradGroup, TrainsLikeOneGemmPerMicroBatch) {
  auto ops = make_cpu_ops();
  for (const int64_t acc : {1, 3, 4}) {
    for (const int64_t group : {2, 4, 8}) {
      SCOPED_TRACE("grad_acc_steps " + std::to_string(acc) + ", group " + std::to_string(group));
      TrainConfig off = config(1, acc), on = config(group, acc);
      off.expert_wgrad_micro_batches = on.expert_wgrad_micro_batches = 2;
      const TrainedRun a = train_to_end(off, *ops), b = train_to_end(on, *ops);
      ASSERT_EQ(a.losses.size(), b.losses.size());
      EXPECT_EQ(a.losses[0], b.losses[0]);
      for (size_t i = 1; i < a.losses.size(); ++i)
        EXPECT_NEAR(a.losses[i], b.losses[i], 1e-5 * std::abs(a.losses[i])) << "step " << i + 1;
      EXPECT_LT(rel_l2(b.dense, a.dense), 1e-5);
      EXPECT_LT(rel_l2(b.expert, a.expert), 1e-5);
      EXPECT_LT(a.losses.back(), a.losses.front()) << "the run did not train";
    }
  }
}

// The model on its own: with overwrite, the step's first group stores the LM head's gradient, so a gradient that
// starts as NaN there ends equal to a zeroed one added to (same G, every grouping of a 4-micro-batch step); the
// rest of the dense gradients are still added to.
TEST(LmHeadWgradGroup, FirstGroupOverwritesTheHeadGradient) {
  const ModelConfig cfg = tiny_model(37, 16, 24, 16);
  const ParamLayout layout = ParamLayout::build(cfg, 0, cfg.num_local_experts);
  const ParamInfo& head = layout.find("lm_head.weight");
  std::vector<float> dense, expert;
  init_params_host(layout, cfg, 7, dense, expert);
  const int64_t B = 2, S = 8, T = B * S, acc = 4;
  std::mt19937 rng(11);
  std::vector<std::vector<int32_t>> ids(acc), labels(acc);
  std::vector<int32_t> pos;
  for (int64_t i = 0; i < T; ++i) pos.push_back(static_cast<int32_t>(i % S));
  for (int64_t m = 0; m < acc; ++m)
    for (int64_t i = 0; i < T; ++i) {
      ids[m].push_back(static_cast<int32_t>(rng() % cfg.vocab_size));
      labels[m].push_back(static_cast<int32_t>(rng() % cfg.vocab_size));
    }
  auto grads = [&](int64_t group, bool overwrite) {
    auto ops = make_cpu_ops();
    MixtralModel model(cfg, *ops, B, S, layout, true, {}, {}, false, 1, group);
    EXPECT_EQ(model.overwrites_lm_head_grad(), group > 1);
    std::vector<float> gd(dense.size(), 0.f), ge(expert.size(), 0.f);
    if (overwrite) std::fill(gd.begin() + head.offset, gd.begin() + head.offset + head.numel, NAN);
    model.bind(F(dense, {(int64_t)dense.size()}), F(expert, {(int64_t)expert.size()}), F(gd, {(int64_t)gd.size()}),
               F(ge, {(int64_t)ge.size()}));
    for (int64_t m = 0; m < acc; ++m) {
      model.set_micro_batch(m, acc, overwrite);
      const MicroBatch mb{Tensor(ids[m].data(), DType::I32, {T}), Tensor(labels[m].data(), DType::I32, {T}),
                          Tensor(pos.data(), DType::I32, {T})};
      float sum = 0;
      model.forward_backward(mb, 1.f / T, 1.f, Tensor(&sum, DType::F32, {1}), true, 1234);
    }
    return gd;
  };
  for (const int64_t group : {2, 3, 4}) {
    SCOPED_TRACE("group " + std::to_string(group));
    const std::vector<float> added = grads(group, false), stored = grads(group, true);
    double head_sq = 0;
    for (int64_t i = head.offset; i < head.offset + head.numel; ++i) head_sq += double(added[i]) * added[i];
    EXPECT_GT(head_sq, 0.0) << "the LM head's gradient is zero: nothing is tested";
    EXPECT_EQ(added, stored);  // == per element: a stored -0 equals an added +0
  }
}

TEST(LmHeadWgradGroup, PlanConfigAndWarnings) {
  const TrainConfig on = config(4, 4), off = config(1, 4);
  const MemoryPlan p_on = plan_memory(on, DType::BF16), p_off = plan_memory(off, DType::BF16);
  // 4 micro-batches' [tokens, vocab] logit gradients and [tokens, d] hidden states, in bf16.
  const int64_t T = on.dataset.micro_batch_size * on.dataset.max_seq_length;
  EXPECT_EQ(p_on.activation_bytes - p_off.activation_bytes,
            static_cast<size_t>(4 * T * (on.model.vocab_size + on.model.hidden_size) * 2));
  EXPECT_NE(format_memory_plan(on, p_on).find("4 micro-batches' LM-head logit gradients held"), std::string::npos);
  // The step makes its logits in the held gradients: no logits chunk, unless an evaluation's forward needs it.
  EXPECT_EQ(p_on.scratch_bytes, static_cast<size_t>(T) * sizeof(float));
  EXPECT_EQ(p_off.scratch_bytes - p_on.scratch_bytes,
            static_cast<size_t>(p_off.lm_head_rows * on.model.vocab_size) * 2);
  TrainConfig evaluated = on;
  evaluated.validation.every_n_steps = 5;
  EXPECT_EQ(plan_memory(evaluated, DType::BF16).scratch_bytes, p_off.scratch_bytes);
  EXPECT_NE(format_memory_plan(on, p_on).find("LM-head logits (in the held logit gradients"), std::string::npos);
  EXPECT_NE(plan_fit_problem(on, p_on, 1).find("lm_head_wgrad_micro_batches=1"), std::string::npos);
  EXPECT_EQ(plan_fit_problem(off, p_off, 1).find("lm_head_wgrad_micro_batches"), std::string::npos);

  EXPECT_NE(startup_log(config(8, 3)).find("lm_head_wgrad_micro_batches=8 takes effect as 3"), std::string::npos);
  EXPECT_EQ(startup_log(config(3, 3)).find("lm_head_wgrad_micro_batches"), std::string::npos);

  auto group = [](std::vector<std::string> o) {
    return to_train_config(resolve_config(LoadOptions{"L0_sanity", "", std::move(o)})).lm_head_wgrad_micro_batches;
  };
  EXPECT_EQ(group({}), 1);
  EXPECT_EQ(group({"lm_head_wgrad_micro_batches=8"}), 8);
  for (const char* bad : {"lm_head_wgrad_micro_batches=0", "lm_head_wgrad_micro_batches=two"})
    EXPECT_NE(error_of([&] { to_train_config(resolve_config(LoadOptions{"L0_sanity", "", {bad}})); })
                  .find("lm_head_wgrad_micro_batches"),
              std::string::npos)
        << bad;
}

// lm_head_grad_dtype=bfloat16 (the LM head's gradient stored in bf16 by the step's one held-group GEMM): the memory
// plan counts 2 bytes per head element where the fp32 dense gradient had 4, and a backend that computes in fp32
// (here the CPU) is a config error naming the key; the training run is tested on the GPU.
TEST(LmHeadWgradGroup, Bf16GradIsPlannedAndNeedsTheCudaBackend) {
  TrainConfig f32 = config(2, 2), b16 = config(2, 2);
  b16.lm_head_grad_dtype = "bfloat16";
  const MemoryPlan pf = plan_memory(f32, DType::BF16), pb = plan_memory(b16, DType::BF16);
  EXPECT_EQ(pf.param_bytes - pb.param_bytes, static_cast<size_t>(b16.model.vocab_size * b16.model.hidden_size) * 2);
  auto ops = make_cpu_ops();
  try {
    Trainer t(b16, *ops, embedded_corpus_tokens());
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("lm_head_grad_dtype=bfloat16 needs the CUDA bf16 backend"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace mxt::testing
