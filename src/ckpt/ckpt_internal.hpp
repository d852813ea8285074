#pragma once
// Checkpoint internals shared by src/ckpt/*.cpp and the tests: checksums, what a rank writes (segments),
// the shard writer, the manifest, directory operations and test hooks.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mxtrain/checkpoint.hpp"
#include "mxtrain/tensor.hpp"

namespace mxt::ckpt {

// ---- checksum (hash.cpp) ------------------------------------------------------------------------------------
// XXH64 (the public xxHash 64-bit algorithm, seed 0), streaming: fast enough (several GB/s) to check every
// byte of a large checkpoint, strong enough for corruption (not for adversaries).
class Hasher64 {
 public:
  explicit Hasher64(uint64_t seed = 0);
  void update(const void* data, size_t n);
  uint64_t digest() const;

 private:
  uint64_t seed_, v_[4];
  unsigned char buf_[32];
  size_t buf_len_ = 0;
  uint64_t total_ = 0;
};
uint64_t hash64(const void* data, size_t n);
std::string hex64(uint64_t h);  // 16 lower-case hex digits (JSON numbers cannot carry 64 bits everywhere)

// ---- what one rank writes or reads (segments.cpp) -----------------------------------------------------------
// The checkpoint's logical vectors ("keys"), independent of the parallel layout:
//   dense.<role>        the dense flat buffer, dense_numel elements
//   expert.<g>.<role>   global expert g's block: its slice of every expert tensor in layout order
// with role master | adam_m | adam_v. A shard stores elements [begin, end) of some keys; together the shards
// tile every key exactly once. Loading copies the overlaps of stored ranges with the ranges a rank needs,
// so any layout (EP, DP, ZeRO-1 sharding of the moments) reads any other's checkpoint.

// A run of elements in a buffer (device memory for the trainer's buffers): F32, or BF16 for AdamW moments kept in
// bf16 (adamw_moments_dtype). The checkpoint stores every key in F32 whatever the buffer holds.
struct Piece {
  char* base = nullptr;
  int64_t offset = 0, count = 0;  // elements
  DType dtype = DType::F32;
  char* rem = nullptr;  // a master held split (optimizer_store_param_remainders): base its bf16 upper halves, rem the
                        // I16 remainders at the same offsets; the file holds the joined fp32 values
};
// Elements [from, from + n) of a piece to or from host F32: BF16 widened (exact) or narrowed to nearest even.
void download_f32(Ops& ops, const Piece& pc, int64_t from, int64_t n, float* dst);
void upload_f32(Ops& ops, const Piece& pc, int64_t from, int64_t n, const float* src);
// Elements [begin, end) of a key and where they live in this rank's memory, in order.
struct Segment {
  std::string key;
  int64_t begin = 0, end = 0;
  std::vector<Piece> pieces;  // their counts add up to end - begin
  std::vector<float> host;    // filled by snapshot(): then the writer reads this instead of the pieces
  bool in_host = false;
  bool whole = false;  // [begin, end) is the whole key
  int64_t numel() const { return end - begin; }
  std::string name() const;  // the tensor name in the shard file: key, or key[begin:end] for a part
};
const char* role_name(int role);  // 0 master, 1 adam_m, 2 adam_v
// Elements of one expert's block.
int64_t expert_block_numel(const ParamLayout& layout);
// Elements [u, v) of a role's local flat expert buffer, as runs of global experts' blocks; buffer index =
// flat index - shift (the moments of a ZeRO-1 rank start at their shard's offset).
std::vector<Segment> expert_segments(const ParamLayout& layout, int role, char* buf, int64_t shift, int64_t u,
                                     int64_t v, DType dtype = DType::F32, char* rem = nullptr);
// The flat range [begin, end) of each role's elements this rank writes: its moment shard under ZeRO-1, else
// dense split over all ranks and experts over their replicas.
struct WritePlan {
  int64_t dense_begin = 0, dense_end = 0;
  bool expert_flat = false;  // experts: a flat range of the local buffer (ZeRO-1), else whole local experts
  int64_t expert_begin = 0, expert_end = 0;  // flat elements, or local expert indices
};
WritePlan plan_writes(const TrainState& s, int rank, int world);
std::vector<Segment> write_segments(const TrainState& s, const WritePlan& w);
// Everything this rank holds: the masters (whole, or its shard where they are sharded), the moments it keeps.
std::vector<Segment> read_segments(const TrainState& s);
// Copy every segment into host memory (synchronous; the step loop may change the buffers afterwards).
void snapshot(Ops& ops, std::vector<Segment>& segs);
size_t segment_bytes(const std::vector<Segment>& segs);

// ---- files (file_io.cpp) ------------------------------------------------------------------------------------
// A file written with write(2) and made durable with fsync(2) on close(); every error names the file.
class DurableFile {
 public:
  explicit DurableFile(const std::string& path);  // creates or truncates
  ~DurableFile();                                 // closes without fsync if close() was not reached
  DurableFile(const DurableFile&) = delete;
  DurableFile& operator=(const DurableFile&) = delete;
  void write(const void* data, size_t n);
  void close();  // fsync + close
  uint64_t written() const { return written_; }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t written_ = 0;
};
void write_durable(const std::string& path, const std::string& text);

// ---- one shard file (shard_writer.cpp) ----------------------------------------------------------------------
struct TensorRecord {
  std::string name;  // in the file
  std::string key;
  int64_t begin = 0, end = 0;
  std::string hash;
};
struct ShardRecord {
  std::string file;  // name inside the checkpoint directory
  int rank = 0;
  uint64_t bytes = 0, header_bytes = 0;  // file size; 8 + JSON header length
  std::string header_hash;
  std::vector<TensorRecord> tensors;
};
nlohmann::json to_json(const ShardRecord& r);
ShardRecord shard_from_json(const nlohmann::json& j, const std::string& where);
std::string shard_file_name(int rank);  // shard_00003.safetensors
// Write the segments (from their pieces via ops, or from their host snapshot) as a safetensors file at path,
// checksumming as it goes, fsync it. Throws CheckpointError naming the file (ENOSPC included).
ShardRecord write_shard(const std::string& path, int rank, const std::vector<Segment>& segs, Ops* ops);

// ---- manifest (manifest.cpp) --------------------------------------------------------------------------------
constexpr int kFormatVersion = 1;
struct Manifest {
  int format_version = kFormatVersion;
  int64_t step = 0;
  int world_size = 1, dp_size = 1, ep_size = 1;
  nlohmann::json model;  // the shape keys of config_kwargs (model_shape_json)
  int64_t dense_numel = 0, num_experts = 0, expert_block_numel = 0;
  int64_t data_epoch = 0, data_cursor = 0, data_offset = 0, data_world = 1, data_windows = 0;  // BatchLoader position
  uint64_t seed = 0;
  std::string config_yaml;
  std::vector<ShardRecord> shards;
};
nlohmann::json model_shape_json(const ModelConfig& m);
// The manifest's fields for this run's state (everything but the shards).
Manifest describe(const TrainConfig& cfg, const TrainState& s, int world);
std::string manifest_text(const Manifest& m);
// Parse and check internal consistency (check_tiling).
Manifest read_manifest(const std::string& dir);
// The shards' stored ranges tile every key exactly once; throws CheckpointError naming the gap or overlap.
void check_tiling(const Manifest& m, const std::string& where);
// Throws CheckpointIncompatible naming the config_kwargs key (or buffer size) that differs.
void check_compatible(const Manifest& m, const std::string& dir, const TrainConfig& cfg, const ParamLayout& layout);
// Config keys whose values differ between the checkpoint's resolved YAML and this run's ("key: a -> b").
std::vector<std::string> config_changes(const std::string& saved_yaml, const std::string& current_yaml);

// ---- directories (store.cpp) --------------------------------------------------------------------------------
std::string step_dir_name(int64_t step);  // step_<N>
void fsync_path(const std::string& path);  // a file or a directory; throws CheckpointError
// Removes step_<N>.tmp and *.trash: what a save or a removal that was killed leaves behind.
void remove_leftovers(const std::string& ckpt_dir);
// remove_leftovers, then create a fresh <ckpt_dir>/step_<N>.tmp.
std::string prepare_tmp_dir(const std::string& ckpt_dir, int64_t step);
// Write manifest.json into tmp_dir, make it durable, rename tmp_dir to step_<N> (replacing an old one).
std::string commit_dir(const std::string& ckpt_dir, const std::string& tmp_dir, const Manifest& m);
// Keep the newest `keep` complete checkpoints (0: all); never removes `just_saved`.
void prune_checkpoints(const std::string& ckpt_dir, int64_t keep, int64_t just_saved);
// step_<N> directories without a manifest (logged and skipped by resume).
std::vector<std::string> incomplete_step_dirs(const std::string& ckpt_dir);

// ---- test hooks ---------------------------------------------------------------------------------------------
namespace testing {
// Make shard/manifest writes fail with errno `err` (default ENOSPC) once `bytes` bytes were written in total
// by this process from now on; -1 turns it off.
void fail_writes_after(int64_t bytes, int err = 28);
// Pretend the checkpoint file system has this many bytes free; -1: ask statvfs.
void set_free_bytes(int64_t bytes);
}  // namespace testing
// The writer's view of the hooks.
int64_t free_bytes(const std::string& dir);
int injected_write_error(size_t n_about_to_write);  // 0 or an errno

}  // namespace mxt::ckpt
