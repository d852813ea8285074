// Reassembling the experts of an EP group on one rank (for the final HF export). EP ranks hold equal slices
// [j*El, (j+1)*El) of every expert tensor; a full layout holds all E experts, so each source rank's slice of
// each tensor lands at offset j*El*per_expert inside that tensor.
#include <algorithm>
#include <stdexcept>

#include "mxtrain/comm.hpp"
#include "mxtrain/params.hpp"

namespace mxt {

void gather_all_experts(const ParamLayout& local, const ModelConfig& m, Comm& ep_host,
                        const std::vector<float>& mine, ParamLayout& full_layout, std::vector<float>& all) {
  const int n = ep_host.size(), me = ep_host.rank();
  if (static_cast<int64_t>(mine.size()) != local.expert_numel)
    throw std::invalid_argument("gather_all_experts: expert buffer size does not match the layout");
  const bool root = me == 0;
  full_layout = root ? ParamLayout::build(m, 0, local.num_local_experts * n) : ParamLayout{};
  all.assign(root ? static_cast<size_t>(full_layout.expert_numel) : 0, 0.f);
  // One broadcast per source rank (the interface has no gather): peers hold at most one slice besides theirs.
  std::vector<float> slice(mine.size());
  for (int j = 0; j < n; ++j) {
    if (j == me) std::copy(mine.begin(), mine.end(), slice.begin());
    ep_host.broadcast(slice.data(), static_cast<int64_t>(slice.size()), CommType::F32, j);
    if (!root) continue;
    for (const ParamInfo& p : local.params) {
      if (!p.expert) continue;
      const ParamInfo& f = full_layout.find(p.name);
      std::copy(slice.begin() + p.offset, slice.begin() + p.offset + p.numel,
                all.begin() + f.offset + static_cast<int64_t>(j) * p.numel);
    }
  }
}

}  // namespace mxt
