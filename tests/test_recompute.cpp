// recompute_experts: the backward rebuilds the experts' h13 and SwiGLU output (and, with MXFP8, the output's
// columnwise copy) from the kept input instead of holding them per layer. Same bits, less memory.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "plan_util.hpp"
#include "tiny_config.hpp"
#include "mxtrain/comm.hpp"
#include "mxtrain/config.hpp"
#include "mxtrain/data.hpp"
#include "mxtrain/ops.hpp"
#include "mxtrain/trainer.hpp"

namespace mxt::testing {
namespace {

TrainConfig config(bool fp8, bool recompute) {
  TrainConfig c = tiny_config("mxtrain_test_recompute", 64, 128);  // MXFP8 wants multiples of 32
  c.num_train_steps = 8;
  c.lr_scheduler = {2, 6, 0.1};
  c.fp8.enabled = fp8;
  c.recompute_experts = recompute;
  return c;
}

std::vector<double> train(const TrainConfig& c) {
  auto ops = make_cpu_ops();
  Trainer t(c, *ops, embedded_corpus_tokens());
  return t.run();
}

TEST(RecomputeExperts, TrainsBitForBitLikeKeepingTheActivations) {
  for (const bool fp8 : {false, true}) {
    const std::vector<double> kept = train(config(fp8, false)), rebuilt = train(config(fp8, true));
    ASSERT_EQ(kept.size(), rebuilt.size());
    for (size_t i = 0; i < kept.size(); ++i) EXPECT_EQ(kept[i], rebuilt[i]) << "fp8 " << fp8 << ", step " << i + 1;
    EXPECT_LT(kept.back(), kept.front() - 0.1) << "fp8 " << fp8 << ": the run did not train";
  }
}

// The plan drops every layer's h13 and SwiGLU output (MXFP8: h13 and the output's columnwise copy) for one
// shared copy, and with MXFP8 keeps the input's rowwise copy per layer instead.
TEST(RecomputeExperts, PlanDropsThePerLayerBuffers) {
  auto buf = [](int64_t bytes) { return (bytes + 255) / 256 * 256; };
  auto mx_copy = [&](int64_t elems) { return buf(elems) + buf((elems + 31) / 32); };  // codes + E8M0 scales
  for (const bool fp8 : {false, true}) {
    for (const int ep : {1, 2}) {
      TrainConfig off_c = config(fp8, false), on_c = config(fp8, true);
      off_c.parallelism.ep_size = on_c.parallelism.ep_size = ep;
      off_c.model.num_hidden_layers = on_c.model.num_hidden_layers = 6;
      const MemoryPlan off = plan_memory(off_c, DType::BF16), on = plan_memory(on_c, DType::BF16);
      const ModelConfig& m = on_c.model;
      const int64_t L = m.num_hidden_layers, d = m.hidden_size, f = m.intermediate_size, k = m.num_experts_per_tok;
      const int64_t T = on_c.dataset.micro_batch_size * on_c.dataset.max_seq_length, R = T * k, a = 2;
      const int64_t C = ep > 1 ? ep_capacity_rows(T, k, m.num_local_experts, ep, 0.0) : R;
      const int64_t Cx = (C + 31) / 32 * 32;
      const int64_t per_layer = fp8 ? buf(C * 2 * f * a) + mx_copy(Cx * f) : buf(C * 2 * f * a) + buf(C * f * a);
      const int64_t kept_instead = fp8 ? L * mx_copy(Cx * d) : 0;
      const int64_t saved = (L - 1) * per_layer - kept_instead;
      EXPECT_GT(saved, 0);
      EXPECT_EQ(static_cast<int64_t>(off.activation_bytes) - static_cast<int64_t>(on.activation_bytes), saved)
          << "fp8 " << fp8 << ", ep " << ep;
    }
  }
}

// The full L1 shape on 8 ranks, as --dry-run plans it for the GPU: what recomputation and the per-layer
// columnwise weight copies (both on in L1_8x7B_ep.yaml) take off each rank.
TEST(RecomputeExperts, L1PlanPerRank) {
  auto plan = [](const std::vector<std::string>& overrides) {
    return gpu_plan_bytes("L1_8x7B_ep", overrides) / 1073741824.0;
  };
  for (const char* cf : {"parallelism.ep_capacity_factor=0", "parallelism.ep_capacity_factor=1.25"}) {
    const double keep = plan({cf, "recompute_experts=false", "fp8_config.cache_columnwise_weights=true"});
    const double rc = plan({cf, "fp8_config.cache_columnwise_weights=true"}), both = plan({cf});
    std::printf("L1_8x7B_ep per rank, %s: %.1f GiB; recompute_experts %.1f GiB; and per-layer columnwise weight "
                "copies %.1f GiB\n", cf, keep, rc, both);
    EXPECT_LT(rc, keep - 10.0) << cf;
    EXPECT_LT(both, rc - 5.0) << cf;
  }
  // An H200 has 140.4 GiB (143,771 MiB); the CUDA context, NCCL and the ops' own scratch need the rest.
  EXPECT_LT(plan({}), 139.0);
}

// The LM-head chunk the CUDA loss and the plan share: all tokens when they fit, else a multiple of 64 rows
// (below 128 rows as asked), never empty.
TEST(PlanFit, LmHeadChunkRows) {
  EXPECT_EQ(lm_head_chunk_rows(4096, 4096), 4096);
  EXPECT_EQ(lm_head_chunk_rows(128, 4096), 128);
  EXPECT_EQ(lm_head_chunk_rows(4096, 1000), 960);
  EXPECT_EQ(lm_head_chunk_rows(4096, 100), 100);
  EXPECT_EQ(lm_head_chunk_rows(4000, 4000), 4000);  // one chunk: no rounding
  EXPECT_EQ(lm_head_chunk_rows(4096, 1), 1);
  EXPECT_EQ(lm_head_chunk_rows(7, 0), 1);
  const TrainConfig c = to_train_config(resolve_config(LoadOptions{"L0_sanity", "", {"lm_head_chunk_tokens=64"}}));
  const MemoryPlan p = plan_memory(c, DType::BF16);
  EXPECT_EQ(p.scratch_bytes, size_t{64} * 128256 * 2 + 128 * sizeof(float));
}

// The pre-flight check main() runs before allocating: a plan that leaves less than the headroom free fails with
// the shortfall and the keys that shrink it (only those not yet set); one that fits passes; no device, no check.
TEST(PlanFit, TooBigFailsEarlyNamingTheKeysThatShrinkIt) {
  TrainConfig c = to_train_config(resolve_config(LoadOptions{"L1_8x7B_ep", "", {"recompute_experts=false"}}));
  const MemoryPlan p = plan_memory(c, DType::BF16);
  const size_t h200_free = size_t{139} << 30;
  const std::string msg = plan_fit_problem(c, p, h200_free);
  ASSERT_FALSE(msg.empty());
  EXPECT_NE(msg.find("GiB per rank"), std::string::npos) << msg;
  EXPECT_NE(msg.find("recompute_experts=true"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("cache_columnwise_weights=false"), std::string::npos) << msg;  // L1 already sets it
  EXPECT_EQ(msg.find("hopper_gemm=fp8"), std::string::npos) << msg;                 // and this
  // With the bf16 GEMMs (the default) L1 does not fit, and the advice names the FP8 kernels' smaller copies.
  const TrainConfig bf = to_train_config(resolve_config(LoadOptions{"L1_8x7B_ep", "", {"fp8_config.hopper_gemm=bf16"}}));
  const std::string bf_msg = plan_fit_problem(bf, plan_memory(bf, DType::BF16), h200_free);
  EXPECT_NE(bf_msg.find("fp8_config.hopper_gemm=fp8"), std::string::npos) << bf_msg;
  EXPECT_EQ(plan_fit_problem(c, p, p.total_bytes() + kPlanHeadroom), "");
  EXPECT_NE(plan_fit_problem(c, p, p.total_bytes() + kPlanHeadroom - 1), "");
  EXPECT_EQ(plan_fit_problem(c, p, 0), "");
  // The shipped L1 config fits an H200 (140.4 GiB, ~139 GiB free after the CUDA context) with the headroom.
  const TrainConfig l1 = to_train_config(resolve_config(LoadOptions{"L1_8x7B_ep", "", {}}));
  EXPECT_EQ(plan_fit_problem(l1, plan_memory(l1, DType::BF16), h200_free), "");
}

}  // namespace
}  // namespace mxt::testing
