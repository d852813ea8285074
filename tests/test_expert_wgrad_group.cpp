// expert_wgrad_micro_batches G: every micro-batch of a group but its last holds its expert weight-gradient
// operands and the group's last contracts them all in one grouped GEMM; the step's first group stores dW instead
// of adding to it (the trainer no longer zeroes the expert gradients). On the CPU backend the grouped op is the
// single calls in micro-batch order after a zeroing, so training is bit for bit the ungrouped run's; the CUDA
// kernel's fp32 summation order is tested on the GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>


#include "plan_util.hpp"
#include "tiny_config.hpp"
#include "trained_run.hpp"
#include "mxtrain/comm.hpp"
#include "mxtrain/config.hpp"
#include "mxtrain/data.hpp"
#include "mxtrain/model.hpp"
#include "mxtrain/ops.hpp"
#include "mxtrain/params.hpp"
#include "mxtrain/trainer.hpp"

namespace mxt::testing {
namespace {

// acc micro-batches of B sequences of S random token ids and labels (seeded), positions 0..S-1 in each sequence.
struct RandomMicroBatches {
  int64_t tokens;
  std::vector<std::vector<int32_t>> ids, labels;
  std::vector<int32_t> pos;
  RandomMicroBatches(const ModelConfig& cfg, int64_t B, int64_t S, int64_t acc, uint32_t seed)
      : tokens(B * S), ids(acc), labels(acc) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> tok(0, static_cast<int>(cfg.vocab_size) - 1);
    for (int64_t i = 0; i < tokens; ++i) pos.push_back(static_cast<int32_t>(i % S));
    for (int64_t m = 0; m < acc; ++m)
      for (int64_t i = 0; i < tokens; ++i) {
        ids[m].push_back(tok(rng));
        labels[m].push_back(tok(rng));
      }
  }
  MicroBatch at(int64_t m) {
    return MicroBatch{Tensor(ids[m].data(), DType::I32, {tokens}), Tensor(labels[m].data(), DType::I32, {tokens}),
                      Tensor(pos.data(), DType::I32, {tokens})};
  }
};

TrainConfig config(int64_t group, int64_t acc) {
  TrainConfig c = five_step_config("mxtrain_test_expert_wgrad_group", acc);
  c.expert_wgrad_micro_batches = group;
  return c;
}

TrainedRun train(const TrainConfig& c) {
  auto ops = make_cpu_ops();
  return train_to_end(c, *ops);
}

void expect_same(const TrainedRun& a, const TrainedRun& b) {
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (size_t i = 0; i < a.losses.size(); ++i) EXPECT_EQ(a.losses[i], b.losses[i]) << "step " << i + 1;
  ASSERT_EQ(a.expert.size(), b.expert.size());
  EXPECT_EQ(0, std::memcmp(a.expert.data(), b.expert.data(), a.expert.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(a.dense.data(), b.dense.data(), a.dense.size() * sizeof(float)));
}

// Groups that divide the step, that do not (a short last group), larger than the step, and one micro-batch per
// step (nothing is ever held); with the experts' activations recomputed in the backward too.
TEST(ExpertWgradGroup, TrainsBitForBitLikeSingleWeightGradients) {
  for (const int64_t acc : {1, 2, 3, 4}) {
    for (const int64_t group : {2, 3, 8}) {
      for (const bool recompute : {false, true}) {
        SCOPED_TRACE("grad_acc_steps " + std::to_string(acc) + ", group " + std::to_string(group) +
                     (recompute ? ", recompute_experts" : ""));
        TrainConfig off = config(1, acc), on = config(group, acc);
        off.recompute_experts = on.recompute_experts = recompute;
        const TrainedRun a = train(off), b = train(on);
        expect_same(a, b);
        EXPECT_LT(a.losses.back(), a.losses.front()) << "the run did not train";
      }
    }
  }
}

// The model on its own: expert gradients that start as NaN and are overwritten by the step's first group equal
// zeroed ones added to, bit for bit, for every grouping of a 5-micro-batch step (and the dense gradients, which
// are always added to, are untouched by the choice).
TEST(ExpertWgradGroup, FirstGroupOverwritesTheExpertGradients) {
  const ModelConfig cfg = tiny_model(37, 16, 24, 16);
  const ParamLayout layout = ParamLayout::build(cfg, 0, cfg.num_local_experts);
  std::vector<float> dense, expert;
  init_params_host(layout, cfg, 7, dense, expert);
  const int64_t B = 2, S = 8, acc = 5;
  RandomMicroBatches batches(cfg, B, S, acc, 5);
  auto grads = [&](int64_t group, bool overwrite, std::vector<float>& gd, std::vector<float>& ge) {
    auto ops = make_cpu_ops();
    MixtralModel model(cfg, *ops, B, S, layout, true, {}, {}, false, group);
    EXPECT_TRUE(model.overwrites_expert_grads());
    gd.assign(dense.size(), 0.f);
    ge.assign(expert.size(), overwrite ? std::numeric_limits<float>::quiet_NaN() : 0.f);
    model.bind(Tensor(dense.data(), DType::F32, {(int64_t)dense.size()}),
               Tensor(expert.data(), DType::F32, {(int64_t)expert.size()}),
               Tensor(gd.data(), DType::F32, {(int64_t)gd.size()}), Tensor(ge.data(), DType::F32, {(int64_t)ge.size()}));
    for (int64_t m = 0; m < acc; ++m) {
      model.set_micro_batch(m, acc, overwrite);
      const MicroBatch mb = batches.at(m);
      float sum = 0;
      model.forward_backward(mb, 1.f / (B * S), 1.f, Tensor(&sum, DType::F32, {1}), true, 1234);
    }
  };
  std::vector<float> ref_d, ref_e;
  grads(1, false, ref_d, ref_e);
  double norm = 0;
  for (float g : ref_e) norm += static_cast<double>(g) * g;
  EXPECT_GT(norm, 0.0) << "the expert gradients are all zero: nothing is tested";
  for (const int64_t group : {1, 2, 3, 5}) {
    SCOPED_TRACE("group " + std::to_string(group));
    std::vector<float> gd, ge;
    grads(group, true, gd, ge);
    EXPECT_EQ(0, std::memcmp(ge.data(), ref_e.data(), ge.size() * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(gd.data(), ref_d.data(), gd.size() * sizeof(float)));
  }
}

// Under MXFP8 on the FP8 kernels (hopper_gemm=fp8) the experts use their own weight-gradient kernels: the key
// changes nothing, and the trainer zeroes their gradients as before.
TEST(ExpertWgradGroup, IgnoredWithMxfp8Kernels) {
  TrainConfig off = config(1, 2), on = config(2, 2);
  off.fp8.enabled = on.fp8.enabled = true;
  off.fp8.hopper_gemm = on.fp8.hopper_gemm = "fp8";
  off.model.hidden_size = on.model.hidden_size = 64;  // MXFP8 wants multiples of 32
  off.model.intermediate_size = on.model.intermediate_size = 128;
  expect_same(train(off), train(on));
  EXPECT_EQ(plan_memory(off, DType::BF16).activation_bytes, plan_memory(on, DType::BF16).activation_bytes);
}

// MXFP8 with hopper_gemm=bf16 (the default) holds the dequantised columnwise copies instead, and trains bit for bit
// like one weight-gradient GEMM per micro-batch (the CPU twin adds the sets in the same order), with short last
// groups and with recomputed activations; the plan holds G - 1 sets of them.
TEST(ExpertWgradGroup, Mxfp8WithBf16GemmsHoldsDequantisedOperands) {
  for (const int64_t acc : {2, 3, 4}) {
    for (const int64_t group : {2, 3}) {
      for (const bool recompute : {false, true}) {
        SCOPED_TRACE("grad_acc_steps " + std::to_string(acc) + ", group " + std::to_string(group) +
                     (recompute ? ", recompute" : ""));
        TrainConfig off = config(1, acc), on = config(group, acc);
        for (TrainConfig* c : {&off, &on}) {
          c->fp8.enabled = true;
          c->fp8.hopper_gemm = "bf16";
          c->model.hidden_size = 64;
          c->model.intermediate_size = 128;
          c->recompute_experts = recompute;
        }
        expect_same(train(off), train(on));
        if (acc == 4 && !recompute)
          EXPECT_GT(plan_memory(on, DType::BF16).activation_bytes, plan_memory(off, DType::BF16).activation_bytes);
      }
    }
  }
}

// ... and it really holds them: after a holding micro-batch's backward the expert gradients are untouched (zero),
// where one weight-gradient GEMM per micro-batch has already added to them; the group's last micro-batch brings
// them to the ungrouped run's bits.
TEST(ExpertWgradGroup, Mxfp8WithBf16GemmsDefersTheExpertWeightGradients) {
  const ModelConfig cfg = tiny_model(37, 64, 96, 16);
  const ParamLayout layout = ParamLayout::build(cfg, 0, cfg.num_local_experts);
  std::vector<float> dense, expert;
  init_params_host(layout, cfg, 9, dense, expert);
  const int64_t B = 2, S = 8, acc = 3;
  RandomMicroBatches batches(cfg, B, S, acc, 3);
  Fp8Config fp8;
  fp8.enabled = true;
  fp8.keep_attention_bf16 = true;  // 16 tokens per micro-batch: not whole 32-token blocks
  fp8.hopper_gemm = "bf16";
  // Runs the step; returns the expert gradients' squared norm after each micro-batch, and their final values.
  auto run = [&](int64_t group, std::vector<float>& ge) {
    auto ops = make_cpu_ops();
    MixtralModel model(cfg, *ops, B, S, layout, true, {}, fp8, false, group);
    std::vector<float> gd(dense.size(), 0.f);
    ge.assign(expert.size(), 0.f);
    model.bind(Tensor(dense.data(), DType::F32, {(int64_t)dense.size()}),
               Tensor(expert.data(), DType::F32, {(int64_t)expert.size()}),
               Tensor(gd.data(), DType::F32, {(int64_t)gd.size()}), Tensor(ge.data(), DType::F32, {(int64_t)ge.size()}));
    std::vector<double> norms;
    for (int64_t m = 0; m < acc; ++m) {
      model.set_micro_batch(m, acc, false);
      const MicroBatch mb = batches.at(m);
      float sum = 0;
      model.forward_backward(mb, 1.f / (B * S), 1.f, Tensor(&sum, DType::F32, {1}), true, 1234);
      double n2 = 0;
      for (float g : ge) n2 += static_cast<double>(g) * g;
      norms.push_back(n2);
    }
    return norms;
  };
  std::vector<float> one, grouped;
  const std::vector<double> n1 = run(1, one), n3 = run(3, grouped);
  EXPECT_GT(n1[0], 0.0);
  EXPECT_EQ(n3[0], 0.0) << "the first micro-batch of a group of 3 must hold its operands, not add to dW";
  EXPECT_EQ(n3[1], 0.0);
  EXPECT_GT(n3[2], 0.0);
  EXPECT_EQ(0, std::memcmp(one.data(), grouped.data(), one.size() * sizeof(float)));
}

// The plan holds G - 1 micro-batches' expert operands per layer: dy and x (C x d each), the SwiGLU output (C x f),
// dh13 (C x 2f), and the expert offsets; G is capped at grad_acc_steps.
TEST(ExpertWgradGroup, PlanHoldsGroupMinusOneMicroBatchesOfExpertOperandsPerLayer) {
  auto buf = [](int64_t bytes) { return (bytes + 255) / 256 * 256; };
  for (const int ep : {1, 2}) {
    for (const int64_t group : {2, 3, 4, 9}) {
      TrainConfig off = config(1, 4), on = config(group, 4);
      off.parallelism.ep_size = on.parallelism.ep_size = ep;
      const ModelConfig& m = on.model;
      const int64_t L = m.num_hidden_layers, d = m.hidden_size, f = m.intermediate_size, k = m.num_experts_per_tok;
      const int64_t T = on.dataset.micro_batch_size * on.dataset.max_seq_length, R = T * k, a = 2;
      const int64_t C = ep > 1 ? ep_capacity_rows(T, k, m.num_local_experts, ep, 0.0) : R;
      const int64_t El = m.num_local_experts / ep;
      const int64_t per_set = 2 * buf(C * d * a) + buf(C * f * a) + buf(C * 2 * f * a) + buf((El + 1) * 4);
      const int64_t held = std::min<int64_t>(group, 4) - 1;
      const MemoryPlan p_off = plan_memory(off, DType::BF16), p_on = plan_memory(on, DType::BF16);
      EXPECT_EQ(static_cast<int64_t>(p_on.activation_bytes - p_off.activation_bytes), L * held * per_set)
          << "ep " << ep << ", group " << group;
    }
  }
  // one micro-batch per step: nothing is ever held, nothing planned
  EXPECT_EQ(plan_memory(config(8, 1), DType::BF16).activation_bytes,
            plan_memory(config(1, 1), DType::BF16).activation_bytes);
}

// A plan that does not fit names the key among the ways to shrink it, and the plan says what it holds.
TEST(ExpertWgradGroup, PlanTextAndTheFitAdvice) {
  const TrainConfig on = config(4, 4), off = config(1, 4);
  const MemoryPlan p = plan_memory(on, DType::BF16);
  EXPECT_NE(plan_fit_problem(on, p, 1).find("expert_wgrad_micro_batches=1"), std::string::npos);
  EXPECT_EQ(plan_fit_problem(off, plan_memory(off, DType::BF16), 1).find("expert_wgrad_micro_batches"),
            std::string::npos);
  EXPECT_NE(format_memory_plan(on, p).find("3 micro-batches' expert weight-gradient operands"), std::string::npos);
}

// A key that cannot take effect as written says so at start (capped at grad_acc_steps; ignored under MXFP8).
TEST(ExpertWgradGroup, SaysWhenTheKeyIsCapped) {
  const auto warning = startup_log;
  EXPECT_NE(warning(config(8, 3)).find("expert_wgrad_micro_batches=8 takes effect as 3"), std::string::npos);
  EXPECT_EQ(warning(config(3, 3)).find("expert_wgrad_micro_batches"), std::string::npos);
  TrainConfig fp8 = config(2, 2);
  fp8.fp8.enabled = true;
  fp8.model.hidden_size = 64;
  fp8.model.intermediate_size = 128;
  EXPECT_EQ(warning(fp8).find("expert_wgrad_micro_batches"), std::string::npos);  // hopper_gemm=bf16 holds them
  fp8.fp8.hopper_gemm = "fp8";
  EXPECT_NE(warning(fp8).find("takes effect as 1: the MXFP8 experts on the FP8 kernels"), std::string::npos);
}

TEST(ExpertWgradGroup, ConfigKey) {
  auto group = [](std::vector<std::string> o) {
    return to_train_config(resolve_config(LoadOptions{"L0_sanity", "", std::move(o)})).expert_wgrad_micro_batches;
  };
  EXPECT_EQ(group({}), 1);
  EXPECT_EQ(group({"expert_wgrad_micro_batches=8"}), 8);
  EXPECT_EQ(to_train_config(resolve_config(LoadOptions{"bench_8x1B", "", {}})).expert_wgrad_micro_batches, 8);
  for (const char* bad : {"expert_wgrad_micro_batches=0", "expert_wgrad_micro_batches=two"}) {
    try {
      to_train_config(resolve_config(LoadOptions{"L0_sanity", "", {bad}}));
      ADD_FAILURE() << bad << " was accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("expert_wgrad_micro_batches"), std::string::npos) << e.what();
    }
  }
}

// expert_grad_dtype=bfloat16 (the expert gradients stored in bf16 by the step's one storing GEMM): the memory plan
// counts 2 bytes per expert gradient element instead of 4, and a backend that computes in fp32 (here the CPU) is a
// config error naming the key; the kernels and the training run are tested on the GPU.
TEST(ExpertWgradGroup, Bf16ExpertGradsHalveTheirBytesAndNeedTheCudaBackend) {
  TrainConfig f32 = config(2, 2), b16 = config(2, 2);
  b16.expert_grad_dtype = "bfloat16";
  const MemoryPlan pf = plan_memory(f32, DType::BF16), pb = plan_memory(b16, DType::BF16);
  EXPECT_EQ(pf.param_bytes - pb.param_bytes, static_cast<size_t>(pf.expert_params) * 2);
  auto ops = make_cpu_ops();
  try {
    Trainer t(b16, *ops, embedded_corpus_tokens());
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("expert_grad_dtype=bfloat16 needs the CUDA bf16 backend"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace mxt::testing
