// Independent kernels on two streams: the attention backward's dQ beside its dK/dV kernel
// (MXTRAIN_ATTENTION_BWD_CONCURRENT, default on). Every output element is still written by one CTA in a fixed
// order, so training gives the serial run's losses and weights bit for bit, eager and under CUDA graphs (the
// fork and join are captured). The model's head_dim 128 takes the flash kernels (the Hopper wgmma ones on an
// H200), which the small test models elsewhere (head_dim 16) do not reach.
// Skips without a GPU.
#include <gtest/gtest.h>

#include <cstdlib>
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
};

// Sets the environment variable for one run and clears it after.
TrainedRun train(const TrainConfig& c, bool concurrent) {
  setenv("MXTRAIN_ATTENTION_BWD_CONCURRENT", concurrent ? "1" : "0", 1);
  auto gpu = make_cuda_ops();
  TrainedRun r;
  {
    Trainer t(c, *gpu, embedded_corpus_tokens());
    r.losses = t.run();
    t.master_weights(r.dense, r.expert);
  }
  unsetenv("MXTRAIN_ATTENTION_BWD_CONCURRENT");
  return r;
}

TEST(CudaConcurrent, TwoStreamBackwardGivesTheSerialBits) {
  MXT_REQUIRE_GPU();
  for (bool graphs : {false, true}) {
    SCOPED_TRACE(graphs ? "cuda_graphs" : "eager");
    // head_dim 128, GQA 2:1, seq 128: the flash path, and on Hopper its wgmma backward kernels
    TrainConfig c = testing::tiny_config("mxtrain_test_cuda_concurrent", 256, 128);
    c.model.num_attention_heads = 2;
    c.model.num_key_value_heads = 1;
    c.model.max_position_embeddings = 128;
    c.dataset.max_seq_length = 128;
    c.dataset.stride = 64;
    c.num_train_steps = 5;
    c.grad_acc_steps = 2;
    c.lr_scheduler = {2, 3, 0.1};
    c.cuda_graphs = graphs;
    const TrainedRun serial = train(c, false), concurrent = train(c, true);
    ASSERT_EQ(serial.losses.size(), concurrent.losses.size());
    for (size_t i = 0; i < serial.losses.size(); ++i)
      EXPECT_EQ(serial.losses[i], concurrent.losses[i]) << "step " << i + 1;
    EXPECT_NE(serial.losses.front(), serial.losses.back());  // it trained
    ASSERT_EQ(serial.dense.size(), concurrent.dense.size());
    EXPECT_EQ(0, std::memcmp(serial.dense.data(), concurrent.dense.data(), serial.dense.size() * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(serial.expert.data(), concurrent.expert.data(), serial.expert.size() * sizeof(float)));
  }
}

}  // namespace
}  // namespace mxt::testing
