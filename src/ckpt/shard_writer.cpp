// One rank's shard: a safetensors container (8-byte header length, JSON header, raw F32 data) so standard
// tools can open it, written by our own streaming writer so that every byte is checksummed on the way out
// (no second pass over a large file), the device state streams through a bounded host buffer, and a write
// failure can be injected in tests.
#include <algorithm>
#include <cstdio>
#include <cstring>

#include "ckpt/ckpt_internal.hpp"
#include "mxtrain/ops.hpp"

namespace mxt::ckpt {
namespace {
constexpr int64_t kChunkElems = int64_t(16) << 20;  // 64 MiB of F32 per device -> host transfer

bool little_endian() {
  const uint16_t one = 1;
  unsigned char b;
  std::memcpy(&b, &one, 1);
  return b == 1;
}
}  // namespace

std::string shard_file_name(int rank) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "shard_%05d.safetensors", rank);
  return buf;
}

ShardRecord write_shard(const std::string& path, int rank, const std::vector<Segment>& segs, Ops* ops) {
  if (!little_endian()) throw CheckpointError("checkpoint file " + path + ": big-endian hosts are not supported");
  ShardRecord rec;
  rec.file = path.substr(path.find_last_of('/') + 1);
  rec.rank = rank;

  nlohmann::ordered_json hdr;
  hdr["__metadata__"] = {{"format", "mxtrain-checkpoint-shard"}, {"rank", std::to_string(rank)}};
  uint64_t offset = 0;
  for (const Segment& s : segs) {
    const uint64_t bytes = static_cast<uint64_t>(s.numel()) * sizeof(float);
    if (hdr.contains(s.name())) throw CheckpointError("checkpoint file " + path + ": tensor " + s.name() + " twice");
    hdr[s.name()] = {{"dtype", "F32"}, {"shape", {s.numel()}}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = hdr.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data section starts 8-byte aligned
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(static_cast<uint64_t>(text.size()) >> (8 * i));

  DurableFile f(path);
  Hasher64 hh;
  hh.update(len, 8);
  hh.update(text.data(), text.size());
  f.write(len, 8);
  f.write(text.data(), text.size());
  rec.header_bytes = 8 + text.size();
  rec.header_hash = hex64(hh.digest());

  std::vector<float> chunk;
  for (const Segment& s : segs) {
    Hasher64 h;
    auto emit = [&](const float* p, int64_t n) {
      h.update(p, static_cast<size_t>(n) * sizeof(float));
      f.write(p, static_cast<size_t>(n) * sizeof(float));
    };
    if (s.in_host) {
      for (int64_t i = 0; i < s.numel(); i += kChunkElems)
        emit(s.host.data() + i, std::min(kChunkElems, s.numel() - i));
    } else {
      if (!ops) throw CheckpointError("checkpoint file " + path + ": tensor " + s.name() + " has no source");
      for (const Piece& pc : s.pieces)
        for (int64_t i = 0; i < pc.count; i += kChunkElems) {
          const int64_t n = std::min(kChunkElems, pc.count - i);
          chunk.resize(static_cast<size_t>(std::max<int64_t>(n, static_cast<int64_t>(chunk.size()))));
          download_f32(*ops, pc, i, n, chunk.data());
          emit(chunk.data(), n);
        }
    }
    rec.tensors.push_back({s.name(), s.key, s.begin, s.end, hex64(h.digest())});
  }
  rec.bytes = f.written();
  f.close();
  return rec;
}

}  // namespace mxt::ckpt
