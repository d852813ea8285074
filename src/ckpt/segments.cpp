// Mapping between the trainer's flat buffers and the checkpoint's layout-independent keys: which ranges a
// rank writes, which it needs, and where they live in its memory.
//
// The local expert buffer is parameter-major ([w13 of layer 0: experts first..first+n-1][w2 of layer 0: ...]),
// an expert's block is expert-major (its slice of every expert tensor in layout order): a flat range maps to
// runs, one per (tensor, expert), and the runs of one expert that are contiguous in its block merge into one
// segment.
#include <algorithm>
#include <cstring>
#include <tuple>
#include <vector>

#include "ckpt/ckpt_internal.hpp"
#include "mxtrain/master_transfer.hpp"
#include "mxtrain/ops.hpp"
#include "mxtrain/params.hpp"

namespace mxt::ckpt {
namespace {

// A role's buffer; a split master's is its working copy (the upper halves), with rem_buffer the remainders.
Tensor* role_buffer(FlatParams& f, int role) {
  return role == 0 ? (f.split() ? &f.working : &f.master) : role == 1 ? &f.adam_m : &f.adam_v;
}
char* rem_buffer(FlatParams& f, int role) { return role == 0 ? static_cast<char*>(f.rem.data) : nullptr; }

// Flat range [begin, end) of a role's buffer that this rank holds: moments as sharded, masters whole unless
// sharded too (master_too).
bool whole(const TrainState::Moments& m, int role) { return m.count < 0 || (role == 0 && !m.master_too); }
std::pair<int64_t, int64_t> held(const TrainState::Moments& m, int role, int64_t numel) {
  if (whole(m, role)) return {0, numel};
  return {std::min(m.offset, numel), std::min(m.offset + m.count, numel)};
}
int64_t shift_of(const TrainState::Moments& m, int role) { return whole(m, role) ? 0 : m.offset; }

}  // namespace

void download_f32(Ops& ops, const Piece& pc, int64_t from, int64_t n, float* dst) {
  if (pc.rem) return download_joined(ops, pc.base, pc.rem, pc.offset + from, n, dst);
  mxt::download_f32(ops, Tensor(pc.base, pc.dtype, {pc.offset + pc.count}), pc.offset + from, n, dst);
}

void upload_f32(Ops& ops, const Piece& pc, int64_t from, int64_t n, const float* src) {
  if (pc.rem) return upload_split(ops, pc.base, pc.rem, pc.offset + from, n, src);
  mxt::upload_f32(ops, Tensor(pc.base, pc.dtype, {pc.offset + pc.count}), pc.offset + from, n, src);
}

const char* role_name(int role) {
  static const char* kRoles[] = {"master", "adam_m", "adam_v"};
  return kRoles[role];
}

std::string Segment::name() const {
  return key + (whole ? "" : "[" + std::to_string(begin) + ":" + std::to_string(end) + "]");
}

int64_t expert_block_numel(const ParamLayout& layout) {
  return layout.num_local_experts > 0 ? layout.expert_numel / layout.num_local_experts : 0;
}

std::vector<Segment> expert_segments(const ParamLayout& layout, int role, char* buf, int64_t shift, int64_t u,
                                     int64_t v, DType dtype, char* rem) {
  const int64_t n = layout.num_local_experts, block = expert_block_numel(layout);
  std::vector<Segment> by_expert(static_cast<size_t>(n));
  int64_t in_block = 0;  // offset of this tensor's slice inside an expert's block
  for (const ParamInfo& p : layout.params) {
    if (!p.expert) continue;
    const int64_t per = p.numel / n;
    for (int64_t j = 0; j < n; ++j) {
      const int64_t lo = std::max(u, p.offset + j * per), hi = std::min(v, p.offset + (j + 1) * per);
      if (lo >= hi) continue;
      const int64_t b = in_block + (lo - p.offset - j * per);
      Segment& s = by_expert[j];
      if (s.pieces.empty()) {
        s.begin = s.end = b;
      } else if (s.end != b) {  // cannot happen for one contiguous [u, v); guard the assumption
        throw CheckpointError("checkpoint: expert block of local expert " + std::to_string(j) +
                              " is not contiguous over the flat range [" + std::to_string(u) + ", " +
                              std::to_string(v) + ")");
      }
      s.pieces.push_back({buf, lo - shift, hi - lo, dtype, rem});
      s.end = b + (hi - lo);
    }
    in_block += per;
  }
  std::vector<Segment> out;
  for (int64_t j = 0; j < n; ++j) {
    if (by_expert[j].pieces.empty()) continue;
    Segment s = std::move(by_expert[j]);
    s.key = "expert." + std::to_string(layout.first_expert + j) + "." + role_name(role);
    s.whole = s.begin == 0 && s.end == block;
    out.push_back(std::move(s));
  }
  return out;
}

WritePlan plan_writes(const TrainState& s, int rank, int world) {
  WritePlan w;
  const int64_t D = s.layout.dense_numel, N = s.layout.expert_numel;
  if (s.dense_moments.count >= 0) {
    std::tie(w.dense_begin, w.dense_end) = held(s.dense_moments, 1, D);
  } else {
    w.dense_begin = D * rank / world;
    w.dense_end = D * (rank + 1) / world;
  }
  if (s.expert_moments.count >= 0) {
    w.expert_flat = true;
    std::tie(w.expert_begin, w.expert_end) = held(s.expert_moments, 1, N);
  } else {  // whole experts per replica
    const int64_t n = s.layout.num_local_experts, r = s.expert_replica, R = std::max(1, s.expert_replicas);
    w.expert_begin = n * r / R;
    w.expert_end = n * (r + 1) / R;
  }
  return w;
}

std::vector<Segment> write_segments(const TrainState& s, const WritePlan& w) {
  std::vector<Segment> segs;
  for (int role = 0; role < 3; ++role) {
    if (w.dense_end <= w.dense_begin) break;
    Segment seg;
    seg.key = std::string("dense.") + role_name(role);
    seg.begin = w.dense_begin;
    seg.end = w.dense_end;
    seg.whole = seg.begin == 0 && seg.end == s.layout.dense_numel;
    const Tensor& t = *role_buffer(s.dense, role);
    seg.pieces.push_back({static_cast<char*>(t.data), w.dense_begin - shift_of(s.dense_moments, role), seg.numel(),
                          t.dtype, rem_buffer(s.dense, role)});
    segs.push_back(std::move(seg));
  }
  for (int role = 0; role < 3; ++role) {
    const Tensor& t = *role_buffer(s.expert, role);
    char* buf = static_cast<char*>(t.data);
    const int64_t shift = shift_of(s.expert_moments, role);
    if (w.expert_flat) {
      for (Segment& seg :
           expert_segments(s.layout, role, buf, shift, w.expert_begin, w.expert_end, t.dtype, rem_buffer(s.expert, role)))
        segs.push_back(std::move(seg));
      continue;
    }
    for (Segment& seg :
         expert_segments(s.layout, role, buf, shift, 0, s.layout.expert_numel, t.dtype, rem_buffer(s.expert, role))) {
      const int64_t j = std::stoll(seg.key.substr(7)) - s.layout.first_expert;  // "expert.<g>.<role>"
      if (j >= w.expert_begin && j < w.expert_end) segs.push_back(std::move(seg));
    }
  }
  return segs;
}

std::vector<Segment> read_segments(const TrainState& s) {
  std::vector<Segment> segs;
  for (int role = 0; role < 3; ++role) {
    const auto [b, e] = held(s.dense_moments, role, s.layout.dense_numel);
    if (e <= b) continue;
    Segment seg;
    seg.key = std::string("dense.") + role_name(role);
    seg.begin = b;
    seg.end = e;
    const Tensor& t = *role_buffer(s.dense, role);
    seg.pieces.push_back({static_cast<char*>(t.data), b - shift_of(s.dense_moments, role), e - b, t.dtype,
                          rem_buffer(s.dense, role)});
    segs.push_back(std::move(seg));
  }
  for (int role = 0; role < 3; ++role) {
    const auto [u, v] = held(s.expert_moments, role, s.layout.expert_numel);
    const Tensor& t = *role_buffer(s.expert, role);
    for (Segment& seg : expert_segments(s.layout, role, static_cast<char*>(t.data), shift_of(s.expert_moments, role),
                                        u, v, t.dtype, rem_buffer(s.expert, role)))
      segs.push_back(std::move(seg));
  }
  return segs;
}

void snapshot(Ops& ops, std::vector<Segment>& segs) {
  for (Segment& seg : segs) {
    seg.host.resize(static_cast<size_t>(seg.numel()));
    float* dst = seg.host.data();
    for (const Piece& pc : seg.pieces) {
      download_f32(ops, pc, 0, pc.count, dst);
      dst += pc.count;
    }
    seg.in_host = true;
  }
}

size_t segment_bytes(const std::vector<Segment>& segs) {
  size_t b = 0;
  for (const Segment& s : segs) b += static_cast<size_t>(s.numel()) * sizeof(float);
  return b;
}

}  // namespace mxt::ckpt
