#pragma once
// Checkpoints: the whole training state, saved per rank in parallel, atomically, verified on load, and
// reshardable across expert-parallel layouts.
//
// On disk, <ckpt_dir>/step_<N>/:
//   manifest.json               written last; a checkpoint is complete iff its manifest is there (manifest.cpp)
//   shard_<rank>.safetensors    one per rank (shard_00000...), F32 1-D tensors in a plain safetensors container
// The state is stored as layout-free vectors ("keys"), each split into parts [begin, end) over the shards:
//   dense.{master,adam_m,adam_v}        the dense flat buffers (ranks split them so they write in parallel;
//                                       under ZeRO-1 each rank writes its moment shard)
//   expert.<g>.{master,adam_m,adam_v}   GLOBAL expert g's block: its slice of every expert tensor, layout order
// A part is named key (whole) or key[begin:end] in its file. A rank loads the overlaps of the stored parts
// with what it holds, so any layout reads any other's checkpoint: EP=2 on 2 ranks resumes at EP=1, DP=2
// (ZeRO-1 moments), EP=4, ...; a rank reads only the experts [first, first+n) its layout holds.
// Scalars (step, data position, seed, the resolved config) and every file's size and checksums live in the
// manifest. The LR schedule, AdamW bias correction and router jitter derive from (seed, step), the data
// order from (seed, epoch): step and loader position are the whole RNG state.
//
// Atomicity: shards and manifest go into step_<N>.tmp/, each file fsync'ed, then the directory, then it is
// renamed to step_<N>/ and the parent fsync'ed. A kill at any moment leaves the previous checkpoints intact;
// stale *.tmp directories are removed by the next save.
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "mxtrain/config.hpp"

namespace mxt {

class Ops;
class BatchLoader;
struct ParamLayout;
struct FlatParams;

// Missing / truncated / corrupt files, I/O failures (the message names the file and the problem).
struct CheckpointError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// A checkpoint that cannot belong to this run (another model shape): a config error, never a fallback.
struct CheckpointIncompatible : ConfigError {
  using ConfigError::ConfigError;
};

// The part of the trainer a checkpoint saves and restores (references into the Trainer).
struct TrainState {
  Ops& ops;
  const ParamLayout& layout;  // its first_expert / num_local_experts: the global experts held on this rank
  FlatParams& dense;
  FlatParams& expert;
  int64_t& step;  // optimizer steps done
  BatchLoader& loader;
  int data_world = 1;  // ranks the loader splits windows over (its `world`)
  // Among the ranks that hold the same experts (the dp replicas): this rank's index and their number. Without
  // ZeRO-1 they split the writing of those experts; the dense state is split over all ranks.
  int expert_replica = 0, expert_replicas = 1;
  // ZeRO-1 (ParamShard): a role's AdamW moments hold elements [offset, offset + count) of its flat buffer
  // (moment i = flat element offset + i; count may run into the padding past numel). count < 0: unsharded,
  // the moments are as long as the buffer. Sharded ranks write exactly their shard (master, m and v).
  // master_too: the master buffer is that shard as well (the trainer's dense master over several ranks), so a
  // resume reads only the shard into it; otherwise the master is whole and read whole.
  struct Moments {
    int64_t offset = 0, count = -1;
    bool master_too = false;
  };
  Moments dense_moments, expert_moments;
};

// The collectives a save and a resume need. The base class is one rank; make_mpi_ckpt_comm() is MPI_COMM_WORLD.
class CkptComm {
 public:
  virtual ~CkptComm() = default;
  virtual int rank() const { return 0; }
  virtual int size() const { return 1; }
  virtual void barrier() {}
  // Rank 0 gets every rank's string in rank order; other ranks get an empty vector.
  virtual std::vector<std::string> gather(const std::string& mine) { return {mine}; }
  // Rank 0's string, on every rank.
  virtual std::string broadcast(const std::string& from_root) { return from_root; }
  // Logical AND over ranks.
  virtual bool all_true(bool mine) { return mine; }
};
std::unique_ptr<CkptComm> make_mpi_ckpt_comm();  // MPI must be initialised

// Saving and resuming for one run: save every checkpoint.save_every_n_steps into ckpt_dir/step_<N>,
// async_save on a background thread (one save in flight at most), keep max_checkpoints, resume from the
// newest usable checkpoint (falling back to older ones when the newest is corrupt, and saying so).
class Checkpointer {
 public:
  explicit Checkpointer(const TrainConfig& cfg, std::unique_ptr<CkptComm> comm = nullptr);
  ~Checkpointer();  // waits for an in-flight save; an error that was not surfaced yet is logged
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // When resume_from_checkpoint and ckpt_dir holds a checkpoint: load the newest usable one into s and return
  // its step; -1 when starting fresh. Throws CheckpointError when checkpoints exist but none is usable, and
  // CheckpointIncompatible when one was saved for another model shape.
  int64_t resume(const TrainState& s);
  // After an optimizer step: save when s.step is a multiple of save_every_n_steps.
  void after_step(const TrainState& s);
  // Save s now (synchronously, or snapshot + background write with async_save). Surfaces the error of the
  // previous asynchronous save, if it failed.
  void save(const TrainState& s);
  // Wait for the in-flight save and commit it; throws its error. Call once after the last step.
  void finish();

 private:
  struct Pending;
  void wait_pending();  // joins, commits (multi-rank async), rethrows
  TrainConfig cfg_;
  std::unique_ptr<CkptComm> comm_;
  std::unique_ptr<Pending> pending_;
  std::vector<std::vector<float>> spare_;  // the last async snapshot's host buffers, reused by the next
  // async_save: the first snapshot's host buffers, allocated and touched on a background thread after the first
  // step, so that the first save does not stall the step loop on page faults (most of a snapshot's cost).
  void start_prefault(const TrainState& s);
  void take_prefault();
  std::thread prefault_;
  std::vector<std::vector<float>> prefaulted_;
  bool prefault_started_ = false;
  int64_t last_saved_step_ = -1;
};

// ---- disk space ----------------------------------------------------------------------------------------------

// Bytes of one checkpoint of this model over all ranks: the fp32 master and both AdamW moments of every dense and
// expert parameter (shard headers, manifest and data-loader state aside: kilobytes).
int64_t checkpoint_bytes(const ModelConfig& m);
struct CheckpointSpace {
  std::string error;    // the first save cannot fit: the run should not start
  std::string warning;  // a later save may not fit (retention, or every checkpoint kept)
};
// Checks the filesystem holding ckpt_dir (or its nearest existing parent) for the saves this run will make:
// `bytes` per checkpoint, `existing` complete checkpoints already there (pruned only after a new one is in), and
// `saves_left` saves to come. free_bytes < 0: ask the filesystem.
CheckpointSpace check_checkpoint_space(const CheckpointConfig& c, int64_t bytes, int64_t existing,
                                       int64_t saves_left, int64_t free_bytes = -1);

// ---- the pieces, for tests and tools ----------------------------------------------------------------------

// Save s into ckpt_dir/step_<s.step> synchronously (every rank calls it); returns the checkpoint directory.
std::string save_checkpoint(const TrainConfig& cfg, const TrainState& s, CkptComm& comm);
// Load the checkpoint in dir into s: the full dense state and only the experts s.layout holds, every byte
// read checked against the manifest's sizes and checksums; then step and loader position. Throws
// CheckpointError naming the file and problem, CheckpointIncompatible naming the config key that differs.
void load_checkpoint(const std::string& dir, const TrainConfig& cfg, const TrainState& s);
// Complete checkpoints (step_<N> holding manifest.json) in ckpt_dir, newest first.
std::vector<std::pair<int64_t, std::string>> find_checkpoints(const std::string& ckpt_dir);
// Drop the lines of a JSON-lines metrics file whose step is after `step` (and any torn last line), so a resumed
// run appends without repeating steps. A missing file is fine.
void truncate_metrics_after(const std::string& path, int64_t step);

}  // namespace mxt
