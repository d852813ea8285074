// Stage names and the stage clock hook behind TraceScope.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "tiny_config.hpp"
#include "mxtrain/data.hpp"
#include "mxtrain/ops.hpp"
#include "mxtrain/trace.hpp"
#include "mxtrain/trainer.hpp"

namespace mxt {
namespace {

TEST(Trace, StageKindDropsLayerAndMicroBatchNumbers) {
  EXPECT_EQ(stage_kind("layer 12 moe backward"), "moe backward");
  EXPECT_EQ(stage_kind("layer 0 attention"), "attention");
  EXPECT_EQ(stage_kind("micro_batch 3"), "micro_batch");
  EXPECT_EQ(stage_kind("ep combine (backward, wait)"), "ep combine (backward, wait)");
  EXPECT_EQ(stage_kind("layer x"), "layer x");  // not a layer number: kept
  EXPECT_EQ(stage_kind("fp8 e4m3"), "fp8 e4m3");
}

struct RecordingClock final : StageClock {
  std::vector<std::string> seen;
  void begin(const char* name) override { seen.push_back(std::string("+") + name); }
  void end() override { seen.push_back("-"); }
  void reset() override {}
  void log(const std::string&, int) override {}
  void mark(const char* op) override { seen.push_back(std::string("*") + op); }
};

TEST(Trace, StageMarkReachesOnlyAnInstalledClock) {
  RecordingClock clock;
  stage_mark("not seen");
  install_stage_clock(&clock);
  {
    TraceScope scope("layer 0 attn: norm");
    stage_mark("rmsnorm_forward");
  }
  install_stage_clock(nullptr);
  stage_mark("not seen either");
  EXPECT_EQ(clock.seen, (std::vector<std::string>{"+layer 0 attn: norm", "*rmsnorm_forward", "-"}));
}

TEST(Trace, InstalledClockSeesNestedScopesInOrder) {
  RecordingClock clock;
  install_stage_clock(&clock);
  {
    TraceScope outer("layer 1 moe");
    TraceScope inner(std::string("experts"));
  }
  install_stage_clock(nullptr);
  { TraceScope after("not seen"); }
  EXPECT_EQ(clock.seen, (std::vector<std::string>{"+layer 1 moe", "+experts", "-", "-"}));
  EXPECT_EQ(stage_clock(), nullptr);
}

// A training step opens every stage MXTRAIN_STAGE_TIMING's table is read by (docs/perf.md, session 26), each
// closed before its enclosing one.
TEST(Trace, TrainingStepOpensEverySubStage) {
  TrainConfig c = testing::tiny_config("mxtrain_test_trace_stages");
  c.num_train_steps = 2;
  c.lr_scheduler = {1, 1, 0.1};
  auto ops = make_cpu_ops();
  Trainer trainer(c, *ops, embedded_corpus_tokens());
  RecordingClock clock;
  install_stage_clock(&clock);
  trainer.run();
  install_stage_clock(nullptr);
  for (const char* name :
       {"attn: norm", "attn: qkv projections", "attn: rope", "attn: core", "attn: out projection + residual",
        "attn bwd: out projection", "attn bwd: core", "attn bwd: rope", "attn bwd: qkv projections",
        "attn bwd: norm + residual", "moe: norm + router", "moe: permute", "experts", "moe: unpermute + residual",
        "moe bwd: unpermute", "experts backward", "experts wgrad", "moe bwd: permute + router + norm + residual",
        "lm head + loss (forward and backward)", "grad_reduce + optimizer"}) {
    const int64_t opened = std::count(clock.seen.begin(), clock.seen.end(), std::string("+") + name);
    // per micro-batch and layer (the LM head: per micro-batch; the optimizer: per step)
    EXPECT_GE(opened, 2) << name;
  }
  int64_t depth = 0, max_depth = 0;
  for (const std::string& e : clock.seen) {
    depth += e == "-" ? -1 : 1;
    ASSERT_GE(depth, 0) << "a stage closed that was not open";
    max_depth = std::max(max_depth, depth);
  }
  EXPECT_EQ(depth, 0) << "a stage left open";
  EXPECT_GE(max_depth, 3);  // micro-batch > layer block > sub-stage
}

}  // namespace
}  // namespace mxt
