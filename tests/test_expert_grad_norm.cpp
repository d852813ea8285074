// The clipping norm's expert share from the weight-gradient GEMMs (Ops::sums_wgrad_norm): where each expert weight
// gradient is one storing GEMM per step, the trainer takes its sum of squares from that GEMM instead of a second
// pass over all expert gradients. CpuOps does not fuse, so a CPU backend that claims to (its composition underneath:
// the store, then sum_squares per weight) checks the trainer's side: every such GEMM adds once per step into a
// norm zeroed per step, and the separate pass then leaves the experts out. The CUDA epilogue's sums are tested on
// the GPU (CudaExpertWgradGroup.NormSumsTheStoredSquares).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu/cpu_ops.hpp"
#include "tiny_config.hpp"
#include "mxtrain/data.hpp"
#include "mxtrain/trainer.hpp"

namespace mxt::testing {
namespace {

class NormSummingCpuOps : public CpuOps {
 public:
  int calls = 0;
  bool sums_wgrad_norm() const override { return true; }
  void grouped_gemm_wgrad_sets_norm(const std::vector<WgradRowSet>& sets, const Tensor& dW,
                                    const Tensor& acc) override {
    ++calls;
    CpuOps::grouped_gemm_wgrad_sets_norm(sets, dW, acc);
  }
};

struct Steps {
  std::vector<StepResult> results;
  std::vector<float> dense, expert;
};

Steps train(const TrainConfig& c, Ops& ops) {
  Trainer t(c, ops, embedded_corpus_tokens());
  Steps s;
  for (int64_t i = 0; i < c.num_train_steps; ++i) s.results.push_back(t.train_step());
  t.master_weights(s.dense, s.expert);
  return s;
}

TrainConfig config(int64_t acc, int64_t group) {
  TrainConfig c = five_step_config("mxtrain_test_expert_grad_norm", acc);
  c.expert_wgrad_micro_batches = group;
  return c;
}

// One storing GEMM per weight and step (a group covering the step): the norm from those GEMMs equals the separate
// pass's to fp32 summation order (per weight instead of one pass), and so does the training it clips.
TEST(ExpertGradNorm, FromTheWeightGradientGemmsWhereEachIsOnePerStep) {
  for (const int64_t acc : {1, 3}) {
    SCOPED_TRACE("grad_acc_steps " + std::to_string(acc));
    TrainConfig c = config(acc, acc);
    c.max_grad_norm = 0.05;  // clipping in every step, so the norm steers the update
    auto plain = make_cpu_ops();
    NormSummingCpuOps summing;
    const Steps a = train(c, *plain), b = train(c, summing);
    EXPECT_EQ(summing.calls, c.num_train_steps * c.model.num_hidden_layers * 2) << "w13 and w2 of every layer";
    ASSERT_EQ(a.results.size(), b.results.size());
    for (size_t i = 0; i < a.results.size(); ++i) {
      EXPECT_GT(a.results[i].grad_norm, 2 * c.max_grad_norm) << "step " << i + 1 << " did not clip";
      EXPECT_NEAR(b.results[i].grad_norm, a.results[i].grad_norm, 1e-6 * a.results[i].grad_norm) << "step " << i + 1;
      EXPECT_NEAR(b.results[i].loss, a.results[i].loss, 1e-6 * a.results[i].loss) << "step " << i + 1;
    }
    EXPECT_LT(a.results.back().loss, a.results.front().loss) << "the run did not train";
  }
}

// Several weight-gradient GEMMs per step (groups shorter than the step) add to the gradients: the trainer keeps
// the separate pass, and the run is the plain backend's bit for bit.
TEST(ExpertGradNorm, SeparatePassWhereTheGemmsAdd) {
  const TrainConfig c = config(3, 1);
  auto plain = make_cpu_ops();
  NormSummingCpuOps summing;
  const Steps a = train(c, *plain), b = train(c, summing);
  EXPECT_EQ(summing.calls, 0);
  for (size_t i = 0; i < a.results.size(); ++i) EXPECT_EQ(a.results[i].grad_norm, b.results[i].grad_norm);
  EXPECT_EQ(0, std::memcmp(a.expert.data(), b.expert.data(), a.expert.size() * sizeof(float)));
}

// MXTRAIN_EXPERT_NORM=separate keeps the separate pass (the GEMMs are not asked for the norm); another value is an
// error naming the variable.
TEST(ExpertGradNorm, EnvironmentSwitch) {
  struct Unset {
    ~Unset() { unsetenv("MXTRAIN_EXPERT_NORM"); }
  } unset;
  const TrainConfig c = config(2, 2);
  setenv("MXTRAIN_EXPERT_NORM", "separate", 1);
  NormSummingCpuOps summing;
  train(c, summing);
  EXPECT_EQ(summing.calls, 0);
  setenv("MXTRAIN_EXPERT_NORM", "sepparate", 1);
  try {
    Trainer t(c, summing, embedded_corpus_tokens());
    ADD_FAILURE() << "a misspelt value was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("MXTRAIN_EXPERT_NORM"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mxt::testing
