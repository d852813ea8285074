// lm_head_grad_dtype=bfloat16: the LM head's weight gradient stored in bf16 by the step's one held-group GEMM
// (cuBLASLt, beta 0) and read in bf16 by the clipping norm and AdamW. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "cuda_test_util.hpp"
#include "tiny_config.hpp"
#include "trained_run.hpp"
#include "mxtrain/config.hpp"

namespace mxt::testing {
namespace {

TrainedRun train_head(const std::string& head_dtype, bool graphs, bool split_masters) {
  TrainConfig c = tiny_config("mxtrain_test_cuda_lm_head_grad_bf16", 64, 128);
  c.num_train_steps = 6;
  c.grad_acc_steps = 3;
  c.lm_head_wgrad_micro_batches = 3;
  c.lr_scheduler = {2, 4, 0.1};
  c.cuda_graphs = graphs;
  c.optimizer_store_param_remainders = split_masters;
  c.lm_head_grad_dtype = head_dtype;
  auto gpu = make_cuda_ops();
  return train_to_end(c, *gpu);
}

// The bf16 LM-head gradient differs from the fp32 one by one rounding (2^-9 relative), which AdamW's normalised
// step carries into the weights at about that size: the run follows the fp32-gradient run (eager and graphs, whole
// and split masters), its first loss equal bit for bit; the dense masters differ (the rounding happened) but little.
TEST(CudaLmHeadGradBf16, FollowsTheF32GradientRun) {
  MXT_REQUIRE_GPU();
  for (const bool graphs : {false, true}) {
    for (const bool split : {false, true}) {
      SCOPED_TRACE(std::string(graphs ? "cuda_graphs" : "eager") + (split ? ", split masters" : ""));
      const TrainedRun f32 = train_head("float32", graphs, split);
      const TrainedRun b16 = train_head("bfloat16", graphs, split);
      ASSERT_EQ(f32.losses.size(), b16.losses.size());
      EXPECT_EQ(f32.losses.front(), b16.losses.front());
      for (size_t i = 0; i < f32.losses.size(); ++i)
        EXPECT_NEAR(b16.losses[i], f32.losses[i], 2e-3 * std::abs(f32.losses[i])) << "step " << i + 1;
      const double d = rel_l2(b16.dense, f32.dense);
      EXPECT_GT(d, 0.0);  // the gradient was rounded
      EXPECT_LT(d, 1e-2);
      EXPECT_LT(rel_l2(b16.expert, f32.expert), 1e-2);
      EXPECT_LT(f32.losses.back(), f32.losses.front());
    }
  }
}

}  // namespace
}  // namespace mxt::testing
