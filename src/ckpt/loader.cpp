// Loading a checkpoint into a rank: every shard file must be there at its recorded size; the rank then reads
// the whole dense state and only the global experts its layout holds, checking each tensor's checksum before
// it is uploaded. A corrupt file is named with the problem; the caller decides whether to fall back.
#include <fcntl.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "ckpt/ckpt_internal.hpp"
#include "mxtrain/data.hpp"
#include "mxtrain/ops.hpp"
#include "mxtrain/params.hpp"
#include "mxtrain/safetensors.hpp"

namespace mxt {
namespace {

namespace fs = std::filesystem;
using namespace ckpt;

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw CheckpointError("checkpoint file " + path + ": " + what);
}

void check_file(const std::string& path, const ShardRecord& r) {
  std::error_code ec;
  if (!fs::exists(path, ec)) bad(path, "missing (the manifest lists it)");
  const uint64_t size = fs::file_size(path, ec);
  if (ec) bad(path, "cannot stat: " + ec.message());
  if (size < r.bytes)
    bad(path, "truncated: " + std::to_string(size) + " bytes, the manifest says " + std::to_string(r.bytes));
  if (size > r.bytes)
    bad(path, "has " + std::to_string(size) + " bytes, the manifest says " + std::to_string(r.bytes));
}

// The file's own header bytes against the manifest's checksum (a damaged header could still parse).
void check_header(const std::string& path, const ShardRecord& r) {
  std::string buf(r.header_bytes, '\0');
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) bad(path, std::string("cannot open: ") + std::strerror(errno));
  const ssize_t n = ::pread(fd, buf.data(), buf.size(), 0);
  ::close(fd);
  if (n != static_cast<ssize_t>(buf.size())) bad(path, "cannot read its header");
  if (hex64(hash64(buf.data(), buf.size())) != r.header_hash) bad(path, "checksum mismatch in the header");
}

// Opens shard files on first use (header checked), and hands out each stored tensor once its checksum matched.
class ShardReader {
 public:
  explicit ShardReader(const std::string& dir) : dir_(dir) {}

  const float* tensor(const ShardRecord& r, const TensorRecord& t) {
    const std::string path = dir_ + "/" + r.file;
    const SafetensorsFile& f = open(r);
    const int64_t numel = t.end - t.begin;
    if (!f.has(t.name)) bad(path, "tensor '" + t.name + "' is not in the file");
    const SafetensorsTensorInfo& info = f.info(t.name);
    if (info.dtype != "F32" || info.numel() != numel)
      bad(path, "tensor '" + t.name + "' is " + info.dtype + " " + shape_to_string(info.shape) + ", expected F32 [" +
                    std::to_string(numel) + "]");
    const uint8_t* src = f.raw(t.name);
    if (verified_.insert(path + "\n" + t.name).second &&
        hex64(hash64(src, static_cast<size_t>(numel) * sizeof(float))) != t.hash)
      bad(path, "checksum mismatch in tensor '" + t.name + "': the file is corrupt");
    return reinterpret_cast<const float*>(src);
  }

 private:
  const SafetensorsFile& open(const ShardRecord& r) {
    auto it = files_.find(r.file);
    if (it != files_.end()) return it->second;
    const std::string path = dir_ + "/" + r.file;
    check_header(path, r);
    try {
      return files_.emplace(r.file, SafetensorsFile(path)).first->second;
    } catch (const SafetensorsError& e) {
      throw CheckpointError(std::string("checkpoint ") + e.what());
    }
  }
  std::string dir_;
  std::map<std::string, SafetensorsFile> files_;
  std::set<std::string> verified_;
};

// Elements [from, from + count) of a segment, from host src into its pieces.
void scatter(Ops& ops, const Segment& seg, int64_t from, int64_t count, const float* src) {
  for (const Piece& pc : seg.pieces) {
    if (count == 0) return;
    if (from >= pc.count) {
      from -= pc.count;
      continue;
    }
    const int64_t n = std::min(count, pc.count - from);
    upload_f32(ops, pc, from, n, src);
    src += n;
    count -= n;
    from = 0;
  }
}

}  // namespace

void load_checkpoint(const std::string& dir, const TrainConfig& cfg, const TrainState& s) {
  const Manifest m = read_manifest(dir);
  check_compatible(m, dir, cfg, s.layout);
  for (const ShardRecord& r : m.shards) check_file(dir + "/" + r.file, r);

  // Every range this rank holds, from the stored parts that overlap it (the manifest guarantees they tile).
  std::map<std::string, std::vector<std::pair<const ShardRecord*, const TensorRecord*>>> parts;
  for (const ShardRecord& r : m.shards)
    for (const TensorRecord& t : r.tensors) parts[t.key].emplace_back(&r, &t);
  ShardReader reader(dir);
  for (const Segment& need : read_segments(s))
    for (const auto& [r, t] : parts[need.key]) {
      const int64_t lo = std::max(need.begin, t->begin), hi = std::min(need.end, t->end);
      if (lo < hi) scatter(s.ops, need, lo - need.begin, hi - lo, reader.tensor(*r, *t) + (lo - t->begin));
    }

  // Data position. Same number of data ranks: exactly where it was. Otherwise the units consumed this epoch
  // over all ranks, split over this run's ranks (exact for one source within an epoch, without packing).
  if (m.data_windows != s.loader.num_windows())
    spdlog::warn("checkpoint {}: the dataset had {} windows, now {}: the data order will not continue exactly", dir,
                 m.data_windows, s.loader.num_windows());
  if (m.data_world == s.data_world) {
    s.loader.set_position(m.data_epoch, m.data_cursor, m.data_offset);
  } else {
    const int64_t consumed = m.data_cursor * m.data_world;
    if (consumed % s.data_world != 0 || m.data_offset != 0)
      spdlog::warn("checkpoint {}: {} units of epoch {} were read by {} data ranks (offset {}); {} ranks cannot "
                   "continue that exactly", dir, consumed, m.data_epoch, m.data_world, m.data_offset, s.data_world);
    s.loader.set_position(m.data_epoch, std::min(consumed / s.data_world, s.loader.windows_per_epoch()), 0);
  }
  s.step = m.step;
}

}  // namespace mxt
