// cuda_graphs: from the second step each micro-batch's forward + backward is a replayed CUDA graph. The replay
// runs the eager step's kernels in the same order on the same buffers, so losses and weights are the eager
// run's bit for bit: bf16 and MXFP8 (whose weight quantisation sits in the first micro-batch's graph), and with
// sequence packing, whose per-micro-batch token counts change the loss scale baked into a graph (recaptured).
// Skips without a GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "cuda_test_util.hpp"
#include "tiny_config.hpp"
#include "mxtrain/data.hpp"
#include "mxtrain/trainer.hpp"

namespace mxt::testing {
namespace {

struct TrainedRun {
  std::vector<double> losses;
  std::vector<float> dense, expert;
  bool replayed = false;
};

TrainedRun train(TrainConfig c, bool graphs) {
  c.cuda_graphs = graphs;
  auto gpu = make_cuda_ops();
  Trainer t(c, *gpu, embedded_corpus_tokens());
  TrainedRun r;
  r.losses = t.run();
  r.replayed = t.replaying_graphs();
  t.master_weights(r.dense, r.expert);
  return r;
}

TEST(CudaGraphs, ReplayGivesTheEagerStepsBitForBit) {
  MXT_REQUIRE_GPU();
  struct Case {
    const char* name;
    bool fp8, packing;
  };
  for (const Case& k : {Case{"bf16", false, false}, Case{"mxfp8", true, false}, Case{"bf16 packed", false, true}}) {
    SCOPED_TRACE(k.name);
    TrainConfig c = testing::tiny_config("mxtrain_test_cuda_graphs", 64, 128);
    c.num_train_steps = 6;
    c.grad_acc_steps = 3;
    c.lr_scheduler = {2, 4, 0.1};
    c.fp8.enabled = k.fp8;
    c.dataset.sequence_packing = k.packing;
    const TrainedRun eager = train(c, false), graphed = train(c, true);
    EXPECT_FALSE(eager.replayed);
    ASSERT_TRUE(graphed.replayed) << "the capture failed (see the warning): nothing was replayed";
    ASSERT_EQ(eager.losses.size(), graphed.losses.size());
    for (size_t i = 0; i < eager.losses.size(); ++i) EXPECT_EQ(eager.losses[i], graphed.losses[i]) << "step " << i + 1;
    EXPECT_NE(eager.losses.front(), eager.losses.back());  // it trained
    ASSERT_EQ(eager.dense.size(), graphed.dense.size());
    EXPECT_EQ(0, std::memcmp(eager.dense.data(), graphed.dense.data(), eager.dense.size() * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(eager.expert.data(), graphed.expert.data(), eager.expert.size() * sizeof(float)));
  }
}

// Held-out evaluations between steps (forward only, eager) leave the graphed training bit for bit as it was, and
// give the eager run's numbers; bf16 and MXFP8 (the evaluation may quantise the weights the next graph re-quantises).
TEST(CudaGraphs, ValidationBetweenReplayedStepsChangesNothing) {
  MXT_REQUIRE_GPU();
  for (bool fp8 : {false, true}) {
    SCOPED_TRACE(fp8 ? "mxfp8" : "bf16");
    TrainConfig c = testing::tiny_config("mxtrain_test_cuda_graphs_validation", 64, 128);
    c.num_train_steps = 6;
    c.grad_acc_steps = 3;
    c.lr_scheduler = {2, 4, 0.1};
    c.fp8.enabled = fp8;
    const TrainedRun plain = train(c, true);
    c.validation.every_n_steps = 2;
    c.validation.num_batches = 2;
    const std::vector<int32_t> all = embedded_corpus_tokens();
    const std::vector<int32_t> held_out(all.end() - 20000, all.end());
    std::vector<double> val[2];
    for (bool graphs : {false, true}) {
      c.cuda_graphs = graphs;
      auto gpu = make_cuda_ops();
      Trainer t(c, *gpu, all);
      t.set_validation_data(held_out);
      const std::vector<double> losses = t.run();
      if (graphs) {
        EXPECT_TRUE(t.replaying_graphs());
        EXPECT_EQ(losses, plain.losses);
      }
      for (int i = 0; i < 2; ++i) val[graphs].push_back(t.evaluate().loss);
    }
    EXPECT_EQ(val[0], val[1]);   // eager and graphed training reach the same weights
    EXPECT_EQ(val[1][0], val[1][1]);  // the same micro-batches each time
  }
}

}  // namespace
}  // namespace mxt::testing
