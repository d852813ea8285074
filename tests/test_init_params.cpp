// The host init's streams: a tensor up to 2^24 values keeps the one stream it always drew from; a longer one
// continues in chunks with seeds of their own, filled in parallel, the same on any thread count.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "mxtrain/params.hpp"
#include "mxtrain/rng.hpp"
#include "tiny_config.hpp"

namespace mxt {
namespace {

constexpr int64_t kChunk = int64_t{1} << 24;

std::vector<float> draw(uint64_t seed, int64_t n, double stdv) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(stdv * rng.normal());
  return v;
}

TEST(InitParams, LongTensorsContinueInChunksOfTheirOwn) {
  // An embedding of 2^24 + 3,200 values: one full chunk and a partial one.
  const ModelConfig m = testing::tiny_model(kChunk / 32 + 100, 32, 48);
  const ParamLayout layout = ParamLayout::build(m, 0, m.num_local_experts);
  const uint64_t seed = 1234;
  std::vector<float> dense, expert;
  init_params_host(layout, m, seed, dense, expert);

  const ParamInfo& emb = layout.find("model.embed_tokens.weight");
  ASSERT_GT(emb.numel, kChunk);
  const uint64_t stream = hash_string(emb.name, seed);
  const std::vector<float> head = draw(stream, kChunk, m.initializer_range);
  const std::vector<float> tail = draw(init_chunk_seed(stream, 1), emb.numel - kChunk, m.initializer_range);
  const float* got = dense.data() + emb.offset;
  EXPECT_TRUE(std::equal(head.begin(), head.end(), got)) << "chunk 0 left the tensor's own stream";
  EXPECT_TRUE(std::equal(tail.begin(), tail.end(), got + kChunk)) << "chunk 1 is not its own stream's";
  // The second chunk is a stream of its own, not the first one again, and is normal(0, initializer_range).
  EXPECT_FALSE(std::equal(tail.begin(), tail.begin() + 1000, head.begin()));
  double sum = 0, sq = 0;
  for (float x : tail) sum += x, sq += double(x) * x;
  const double n = static_cast<double>(tail.size()), mean = sum / n;
  EXPECT_NEAR(mean, 0.0, 5 * m.initializer_range / std::sqrt(n));
  EXPECT_NEAR(std::sqrt(sq / n - mean * mean), m.initializer_range, 0.05 * m.initializer_range);

  // A short tensor keeps its single stream; an expert's slice its global expert's stream; norms are ones.
  const ParamInfo& q = layout.find("model.layers.1.self_attn.q_proj.weight");
  const std::vector<float> want_q = draw(hash_string(q.name, seed), q.numel, m.initializer_range);
  EXPECT_TRUE(std::equal(want_q.begin(), want_q.end(), dense.data() + q.offset));
  const ParamInfo& w2 = layout.find("model.layers.0.block_sparse_moe.experts.w2");
  const int64_t per = w2.numel / m.num_local_experts;
  const std::vector<float> want_e3 = draw(hash_string(w2.name + "#3", seed), per, m.initializer_range);
  EXPECT_TRUE(std::equal(want_e3.begin(), want_e3.end(), expert.data() + w2.offset + 3 * per));
  const ParamInfo& norm = layout.find("model.norm.weight");
  for (int64_t i = 0; i < norm.numel; ++i) ASSERT_EQ(dense[norm.offset + i], 1.f);
}

// Into uninitialised buffers (the trainer's path): every element written, the same values as the vectors get.
TEST(InitParams, RawBuffersGetEveryElementAndTheVectorsValues) {
  const ModelConfig m = testing::tiny_model(kChunk / 32 + 7, 32, 48);  // one tensor over a chunk
  const ParamLayout layout = ParamLayout::build(m, 1, 2);              // experts 1 and 2 of 4
  std::vector<float> dense, expert;
  init_params_host(layout, m, 99, dense, expert);
  std::vector<float> raw_dense(layout.dense_numel, std::nanf("")), raw_expert(layout.expert_numel, std::nanf(""));
  init_params_host(layout, m, 99, raw_dense.data(), raw_expert.data());
  int64_t unwritten = 0;
  for (float x : raw_dense) unwritten += std::isnan(x);
  for (float x : raw_expert) unwritten += std::isnan(x);
  EXPECT_EQ(unwritten, 0);
  EXPECT_TRUE(raw_dense == dense);
  EXPECT_TRUE(raw_expert == expert);
}

TEST(InitParams, ChunkSeedsDifferPerChunkAndStream) {
  EXPECT_EQ(init_chunk_seed(77, 0), 77u);
  EXPECT_NE(init_chunk_seed(77, 1), init_chunk_seed(77, 2));
  EXPECT_NE(init_chunk_seed(77, 1), init_chunk_seed(78, 1));
  EXPECT_NE(init_chunk_seed(77, 1), 77u);
}

}  // namespace
}  // namespace mxt
