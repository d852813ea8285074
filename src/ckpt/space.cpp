// Disk space for checkpoints, checked before training starts: a save that cannot fit should stop the run in
// seconds, not fail at its first save hours later.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include "ckpt_internal.hpp"
#include "mxtrain/checkpoint.hpp"
#include "mxtrain/params.hpp"

namespace mxt {
namespace {

double gb(int64_t bytes) { return static_cast<double>(bytes) / 1e9; }

// free_bytes of the filesystem that holds `dir`, or of its nearest existing parent (the run creates the rest);
// -1 when even that cannot be asked.
int64_t free_space(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path p = fs::absolute(dir, ec);
  while (!p.empty()) {
    if (fs::exists(p, ec)) return ckpt::free_bytes(p.string());
    if (p == p.parent_path()) break;
    p = p.parent_path();
  }
  return -1;
}

}  // namespace

int64_t checkpoint_bytes(const ModelConfig& m) {
  const ParamLayout all = ParamLayout::build(m, 0, m.num_local_experts);
  return 3 * static_cast<int64_t>(sizeof(float)) * (all.dense_numel + all.expert_numel);
}

CheckpointSpace check_checkpoint_space(const CheckpointConfig& c, int64_t bytes, int64_t existing,
                                       int64_t saves_left, int64_t free_bytes) {
  CheckpointSpace out;
  if (c.ckpt_dir.empty()) return out;
  if (free_bytes < 0) free_bytes = free_space(c.ckpt_dir);
  if (free_bytes < 0) return out;  // nothing to go by: the save itself reports a full disk
  if (free_bytes < bytes) {
    out.error = fmt::format(
        "checkpoint.ckpt_dir={}: one checkpoint of this model takes {:.1f} GB (fp32 master weights and AdamW "
        "moments) but its filesystem has {:.1f} GB free, so the first save would fail. Point checkpoint.ckpt_dir at "
        "a filesystem with room, or set checkpoint.ckpt_dir=null to train without checkpoints",
        c.ckpt_dir, gb(bytes), gb(free_bytes));
    return out;
  }
  // At the most, while a new checkpoint is written before the oldest is pruned: max_checkpoints + 1 on disk.
  const int64_t keep = c.max_checkpoints > 0 ? c.max_checkpoints + 1 : existing + saves_left;
  const int64_t more = std::min(saves_left, std::max<int64_t>(0, keep - existing));
  if (more * bytes > free_bytes)
    out.warning = fmt::format(
        "checkpoint.ckpt_dir={}: {:.1f} GB free holds {} checkpoint(s) of {:.1f} GB, but this run may add {} "
        "({}checkpoint.max_checkpoints={}): a later save will fail for lack of space unless it is freed",
        c.ckpt_dir, gb(free_bytes), free_bytes / bytes, gb(bytes), more,
        existing ? fmt::format("{} already there, ", existing) : "", c.max_checkpoints);
  return out;
}

}  // namespace mxt
