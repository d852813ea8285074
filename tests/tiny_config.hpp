#pragma once
// The tiny Mixtral the trainer tests share: 2 layers, 4 heads over 2 KV heads, 4 experts top-2, vocab 256,
// windows of 32 tokens (stride 8), 2 rows per micro-batch, 2 micro-batches per step. Each test then sets what
// it is about (widths, steps, schedule, checkpoints, fp8).
#include <cstdint>
#include <filesystem>
#include <string>

#include "mxtrain/config.hpp"

namespace mxt::testing {

inline TrainConfig tiny_config(const std::string& output_name, int64_t hidden = 32, int64_t intermediate = 48) {
  TrainConfig c;
  c.model.vocab_size = 256;
  c.model.hidden_size = hidden;
  c.model.intermediate_size = intermediate;
  c.model.num_hidden_layers = 2;
  c.model.num_attention_heads = 4;
  c.model.num_key_value_heads = 2;
  c.model.num_local_experts = 4;
  c.model.num_experts_per_tok = 2;
  c.model.max_position_embeddings = 64;
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

}  // namespace mxt::testing
