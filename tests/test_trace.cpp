// Stage names and the stage clock hook behind TraceScope.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "mxtrain/trace.hpp"

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
};

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

}  // namespace
}  // namespace mxt
