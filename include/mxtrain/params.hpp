#pragma once
// Parameters live in two flat buffers per role (dense: replicated on every rank; expert: sharded by EP later),
// so the optimizer, gradient reduction and checkpoints work on a few large spans.
#include <cstdint>
#include <string>
#include <vector>

#include "mxtrain/config.hpp"
#include "mxtrain/tensor.hpp"

namespace mxt {

class Ops;

struct ParamInfo {
  std::string name;            // HF-style name; fused expert tensors: "...experts.w13" [E,2f,d], "...experts.w2"
  std::vector<int64_t> shape;  // full shape (expert tensors: leading dim = experts held by this rank)
  bool expert = false;
  int64_t offset = 0;          // element offset in its flat buffer
  int64_t numel = 0;
  bool is_norm = false;        // initialised to ones
};

struct ParamLayout {
  std::vector<ParamInfo> params;
  int64_t dense_numel = 0, expert_numel = 0;
  int64_t first_expert = 0, num_local_experts = 0;  // experts [first, first+num) live here
  static ParamLayout build(const ModelConfig& m, int64_t first_expert, int64_t num_local_experts);
  const ParamInfo& find(const std::string& name) const;
};

// Model FLOPs of one training token (forward + backward) at sequence length seq, the HF baseline's formula
// (shared/bench/hf_baseline.py), so that TFLOP/s figures compare: 6 x the active parameters (attention, router,
// top-k experts per layer, and the LM head; not the embedding lookup) + 6 L d seq (causal attention scores,
// half of 12 L d seq). Recomputation is not counted.
double model_flops_per_token(const ModelConfig& m, int64_t seq);

// One role's flat buffers: F32 master, gradient and AdamW moments, and the working copy the forward reads
// in the backend's activation dtype (on the CPU backend the working copy is the master itself).
// ZeRO-1 (Trainer, multi-rank): master and grad are padded to a multiple of the replica count, and
// adam_m / adam_v hold only elements [shard_offset, shard_offset + adam_m.numel()) of them.
// optimizer_store_param_remainders: master stays empty and the fp32 master is working (bf16) + rem (I16), as
// split_master (mxtrain/bf16.hpp) splits it.
struct FlatParams {
  Tensor master, grad, adam_m, adam_v, working, rem;
  int64_t shard_offset = 0;
  bool split() const { return rem.data != nullptr; }
};

// Typed views of one set of flat buffers (the weights, or their gradients).
struct LayerTensors {
  Tensor ln1, wq, wk, wv, wo, ln2, gate, w13, w2;
};
struct ModelTensors {
  Tensor embed, norm, lm_head;
  std::vector<LayerTensors> layers;
};
ModelTensors bind_tensors(const ParamLayout& layout, const ModelConfig& m, const Tensor& dense_flat,
                          const Tensor& expert_flat);

// HF-style init: normal(0, initializer_range) for matrices, ones for norms. Each tensor (and each expert of
// an expert tensor, by global index) draws from its own stream derived from (seed, name), so the weights do
// not depend on the parallel layout. A stream longer than 2^24 values continues in chunks with seeds of their own
// (init_chunk_seed), drawn in parallel. Writes host F32 arrays sized like the flat buffers.
void init_params_host(const ParamLayout& layout, const ModelConfig& m, uint64_t seed,
                      std::vector<float>& dense, std::vector<float>& expert);
// The same into buffers of dense_numel and expert_numel floats, every element written. Uninitialised buffers are
// fine and faster: each thread first touches the pages it draws into (a zero-filled 16 GB vector cost seconds on
// one thread before the draws began).
void init_params_host(const ParamLayout& layout, const ModelConfig& m, uint64_t seed, float* dense, float* expert);
// The seed of a stream's chunk of 2^24 values; chunk 0 keeps the stream's own seed.
uint64_t init_chunk_seed(uint64_t stream_seed, int64_t chunk);

}  // namespace mxt
