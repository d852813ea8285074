#pragma once
// Hugging Face safetensors files: a low-level reader / writer, and the model-level import / export of
// Mixtral weights between HF checkpoints and mxtrain's flat parameter buffers.
//
// File format: 8-byte little-endian header length N, N bytes of JSON
//   {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ..., "__metadata__": {str: str}}
// then the data section; offsets are relative to the start of the data section.
#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "mxtrain/bf16.hpp"  // the bf16 conversions the reader and the writer use
#include "mxtrain/config.hpp"
#include "mxtrain/tensor.hpp"

namespace mxt {

struct ParamLayout;

// Every safetensors / HF checkpoint error; the message names the file and, where there is one, the tensor.
struct SafetensorsError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// IEEE half to fp32, for the reader (bf16: mxtrain/bf16.hpp).
float f16_bits_to_float(uint16_t h);   // IEEE half, subnormals / inf / NaN included

// One tensor described by a file's header.
struct SafetensorsTensorInfo {
  std::string name;
  std::string dtype;            // as written in the header: "F32", "BF16", "F16", "I64", ...
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range within the data section
  int64_t numel() const;        // product of shape (1 for a scalar)
};

// "[2, 3]"
std::string shape_to_string(const std::vector<int64_t>& shape);

// A read-only, memory-mapped safetensors file. The constructor validates the whole header (length, JSON,
// dtypes, shapes, offsets in range, matching dtype*shape, not overlapping) and throws SafetensorsError.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const;
  const std::vector<std::string>& names() const;  // in data-offset order
  bool has(const std::string& name) const;
  const SafetensorsTensorInfo& info(const std::string& name) const;  // throws naming tensor and file
  const std::map<std::string, std::string>& metadata() const;

  // The tensor converted to float (F32, BF16 and F16 are readable; other dtypes throw naming the tensor).
  std::vector<float> read_f32(const std::string& name) const;
  // Elements [first, first + count) of the tensor in row-major order, converted to float, into dst.
  void read_f32(const std::string& name, int64_t first, int64_t count, float* dst) const;
  // The tensor's raw bytes (info(name).end - info(name).begin of them).
  const uint8_t* raw(const std::string& name) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A tensor to write: numel(shape) host floats at data (not copied; must outlive the write call).
struct SafetensorsWriteEntry {
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;
};

// Bytes a tensor of this shape takes in the file in dtype (F32 or BF16).
int64_t safetensors_tensor_bytes(const std::vector<int64_t>& shape, DType dtype);

// Write a safetensors file with every tensor stored as dtype (F32 or BF16), in the given order. The header is
// padded with spaces to a multiple of 8 bytes. Written to a temporary file next to path, then renamed over
// it, so readers never see a half-written file. metadata goes to "__metadata__" (HF expects format=pt).
void write_safetensors(const std::string& path, const std::vector<SafetensorsWriteEntry>& tensors, DType dtype,
                       const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

// Write text to path atomically (temporary file + rename). Throws SafetensorsError.
void write_file_atomic(const std::string& path, const std::string& text);

// ---- Model level ----------------------------------------------------------------------------------------

// Load HF MixtralForCausalLM weights into the flat buffers of `layout` (resized to dense_numel /
// expert_numel). dir_or_file: a directory holding model.safetensors or model.safetensors.index.json
// (sharded; {"weight_map": {name: shard file}}), a .safetensors file, or an index .json file.
// Both naming generations are understood:
//   transformers <= 4: model.layers.{l}.block_sparse_moe.gate.weight [E, d],
//                      model.layers.{l}.block_sparse_moe.experts.{j}.w1.weight / w3.weight [f, d], w2.weight [d, f]
//   transformers >= 5: model.layers.{l}.mlp.gate.weight [E, d],
//                      model.layers.{l}.mlp.experts.gate_up_proj [E, 2f, d] (rows [0, f) gate = w1, [f, 2f) up = w3),
//                      model.layers.{l}.mlp.experts.down_proj [E, d, f] (= w2)
// Only experts [layout.first_expert, first_expert + num_local_experts) are read. A missing or wrongly shaped
// tensor throws SafetensorsError naming the tensor, the shapes and the file; unexpected extra tensors are
// logged (spdlog warn) and skipped. lm_head.weight may be absent only when tie_word_embeddings is true (then
// the embedding is copied into it).
void import_hf_weights(const std::string& dir_or_file, const ParamLayout& layout, const ModelConfig& m,
                       std::vector<float>& dense, std::vector<float>& expert);

// Write the weights as an HF checkpoint into dir (created if needed): model.safetensors, or, when the tensors
// take more than max_shard_bytes, model-0000i-of-0000n.safetensors shards plus model.safetensors.index.json;
// tensors use the original per-expert names (block_sparse_moe.experts.{j}.w1/w2/w3.weight), stored as dtype
// (F32 or BF16). Also writes config.json for transformers' MixtralConfig. Every file is written atomically;
// checkpoint files of an earlier export in dir that the new one does not use are removed. The layout must hold
// all experts (first_expert 0, num_local_experts == m.num_local_experts).
void export_hf_weights(const std::string& dir, const ParamLayout& layout, const ModelConfig& m,
                       const std::vector<float>& dense, const std::vector<float>& expert, DType dtype,
                       int64_t max_shard_bytes = int64_t(5) * 1000 * 1000 * 1000);

// The config.json text export_hf_weights writes (MixtralConfig fields; torch_dtype from dtype).
std::string hf_config_json(const ModelConfig& m, DType dtype);

}  // namespace mxt
