#pragma once
// The tiny Mixtral the trainer tests share: 2 layers, 4 heads over 2 KV heads, 4 experts top-2, vocab 256,
// windows of 32 tokens (stride 8), 2 rows per micro-batch, 2 micro-batches per step. Each test then sets what
// it is about (widths, steps, schedule, checkpoints, fp8).
#include <cstdint>
#include <filesystem>
#include <string>

#include "mxtrain/config.hpp"

namespace mxt::testing {

// The model alone: 2 layers, 4 heads over 2 KV heads, 4 experts top-2; the rest (RoPE base, init range) as the
// ModelConfig defaults unless the test sets them.
inline ModelConfig tiny_model(int64_t vocab = 256, int64_t hidden = 32, int64_t intermediate = 48,
                              int64_t max_positions = 64) {
  ModelConfig m;
  m.vocab_size = vocab;
  m.hidden_size = hidden;
  m.intermediate_size = intermediate;
  m.num_hidden_layers = 2;
  m.num_attention_heads = 4;
  m.num_key_value_heads = 2;
  m.num_local_experts = 4;
  m.num_experts_per_tok = 2;
  m.max_position_embeddings = max_positions;
  return m;
}

inline TrainConfig tiny_config(const std::string& output_name, int64_t hidden = 32, int64_t intermediate = 48) {
  TrainConfig c;
  c.model = tiny_model(256, hidden, intermediate);
  c.model.rope_theta = 10000;
  c.dataset.micro_batch_size = 2;
  c.dataset.max_seq_length = 32;
  c.dataset.stride = 8;
  c.num_train_steps = 30;
  c.grad_acc_steps = 2;
  c.adamw.lr = 3e-3;
  c.lr_scheduler = {3, 27, 0.1};
  c.output_dir = (std::filesystem::temp_directory_path() / output_name).string();
  c.logger.frequency = 10;
  return c;
}

// Five steps of grad_acc_steps = acc micro-batches (warm-up 1, decay 4): the weight-gradient grouping tests' run.
inline TrainConfig five_step_config(const std::string& output_name, int64_t acc) {
  TrainConfig c = tiny_config(output_name, 32, 48);
  c.num_train_steps = 5;
  c.grad_acc_steps = acc;
  c.lr_scheduler = {1, 4, 0.1};
  return c;
}

}  // namespace mxt::testing
