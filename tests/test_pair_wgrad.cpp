// pair_expert_wgrad: an even micro-batch holds its expert weight-gradient operands and the next one contracts
// both in one grouped GEMM. On the CPU backend the paired op is the two single calls in micro-batch order, so
// training is bit for bit the unpaired run's; the CUDA kernel's fp32 summation order is tested on the GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "plan_util.hpp"
#include "tiny_config.hpp"
#include "trained_run.hpp"
#include "mxtrain/comm.hpp"
#include "mxtrain/config.hpp"
#include "mxtrain/data.hpp"
#include "mxtrain/ops.hpp"
#include "mxtrain/trainer.hpp"

namespace mxt::testing {
namespace {

TrainConfig config(bool pair, int64_t acc) {
  TrainConfig c = tiny_config("mxtrain_test_pair_wgrad", 32, 48);
  c.num_train_steps = 5;
  c.grad_acc_steps = acc;
  c.lr_scheduler = {1, 4, 0.1};
  c.pair_expert_wgrad = pair;
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

// Even and odd accumulation counts (an odd count's last micro-batch has no partner), and one micro-batch per
// step (nothing is ever held); with the experts' activations recomputed in the backward too.
TEST(PairExpertWgrad, TrainsBitForBitLikeSingleWeightGradients) {
  for (const int64_t acc : {1, 2, 3, 4}) {
    for (const bool recompute : {false, true}) {
      SCOPED_TRACE("grad_acc_steps " + std::to_string(acc) + (recompute ? ", recompute_experts" : ""));
      TrainConfig off = config(false, acc), on = config(true, acc);
      off.recompute_experts = on.recompute_experts = recompute;
      const TrainedRun a = train(off), b = train(on);
      expect_same(a, b);
      EXPECT_LT(a.losses.back(), a.losses.front()) << "the run did not train";
    }
  }
}

// Under MXFP8 the experts use their own weight-gradient kernels: the key changes nothing.
TEST(PairExpertWgrad, IgnoredWithMxfp8) {
  TrainConfig off = config(false, 2), on = config(true, 2);
  off.fp8.enabled = on.fp8.enabled = true;
  off.model.hidden_size = on.model.hidden_size = 64;  // MXFP8 wants multiples of 32
  off.model.intermediate_size = on.model.intermediate_size = 128;
  expect_same(train(off), train(on));
  EXPECT_EQ(plan_memory(off, DType::BF16).activation_bytes, plan_memory(on, DType::BF16).activation_bytes);
}

// The plan holds one micro-batch's expert operands per layer: dy and x (C x d each), the SwiGLU output (C x f),
// dh13 (C x 2f), and the expert offsets; with grad_acc_steps > 1 only.
TEST(PairExpertWgrad, PlanHoldsOneMicroBatchOfExpertOperandsPerLayer) {
  auto buf = [](int64_t bytes) { return (bytes + 255) / 256 * 256; };
  for (const int ep : {1, 2}) {
    TrainConfig off = config(false, 2), on = config(true, 2);
    off.parallelism.ep_size = on.parallelism.ep_size = ep;
    const ModelConfig& m = on.model;
    const int64_t L = m.num_hidden_layers, d = m.hidden_size, f = m.intermediate_size, k = m.num_experts_per_tok;
    const int64_t T = on.dataset.micro_batch_size * on.dataset.max_seq_length, R = T * k, a = 2;
    const int64_t C = ep > 1 ? ep_capacity_rows(T, k, m.num_local_experts, ep, 0.0) : R;
    const int64_t El = m.num_local_experts / ep;
    const int64_t per_layer = 2 * buf(C * d * a) + buf(C * f * a) + buf(C * 2 * f * a) + buf((El + 1) * 4);
    const MemoryPlan p_off = plan_memory(off, DType::BF16), p_on = plan_memory(on, DType::BF16);
    EXPECT_EQ(static_cast<int64_t>(p_on.activation_bytes - p_off.activation_bytes), L * per_layer) << "ep " << ep;
  }
  // one micro-batch per step: nothing is ever held, nothing planned
  EXPECT_EQ(plan_memory(config(true, 1), DType::BF16).activation_bytes,
            plan_memory(config(false, 1), DType::BF16).activation_bytes);
}

// A plan that does not fit names the key among the ways to shrink it, and the plan says what it holds.
TEST(PairExpertWgrad, PlanTextAndTheFitAdvice) {
  const TrainConfig on = config(true, 2), off = config(false, 2);
  const MemoryPlan p = plan_memory(on, DType::BF16);
  EXPECT_NE(plan_fit_problem(on, p, 1).find("pair_expert_wgrad=false"), std::string::npos);
  EXPECT_EQ(plan_fit_problem(off, plan_memory(off, DType::BF16), 1).find("pair_expert_wgrad"), std::string::npos);
  EXPECT_NE(format_memory_plan(on, p).find("(pair_expert_wgrad)"), std::string::npos);
}

TEST(PairExpertWgrad, ConfigKey) {
  EXPECT_FALSE(to_train_config(resolve_config(LoadOptions{"L0_sanity", "", {}})).pair_expert_wgrad);
  EXPECT_TRUE(to_train_config(resolve_config(LoadOptions{"L0_sanity", "", {"pair_expert_wgrad=true"}})).pair_expert_wgrad);
  EXPECT_THROW(resolve_config(LoadOptions{"L0_sanity", "", {"pair_expert_wgrad=maybe"}}), ConfigError);
}

}  // namespace
}  // namespace mxt::testing
