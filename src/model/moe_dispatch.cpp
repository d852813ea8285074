// Expert parallelism's two MoE stages. dispatch: this rank's permuted rows (grouped by global expert) go to
// the EP ranks that own their experts, with their routing weights (one exchange), and arrive expert-major, as
// the grouped GEMMs read them: the exchange moves one piece per (peer, expert) and places each where it belongs,
// so no reorder runs before or after it. combine: the reverse. The backward runs the same exchanges with the
// roles swapped: combine's backward is a dispatch of the output gradient, dispatch's backward a combine of the
// input and routing-weight gradients. The pieces come from exchange_expert_counts, the one place where routing
// reaches the host, once per layer per forward; the backward reuses them. With parallelism.ep_overlap the
// backward's combine is started before the experts' w13 weight gradient, which runs alongside it on the compute
// stream (moe_block.cpp).
#include "mxtrain/model.hpp"
#include "mxtrain/trace.hpp"

namespace mxt {

int64_t MixtralModel::moe_dispatch(int l, const std::function<void()>& permute) {
  TraceScope trace("ep dispatch");
  LayerActs& a = acts_[l];
  EpSplits& sp = ep_splits_[l];
  // The permutation runs on the device while the host waits for the counts and exchanges them.
  exchange_expert_counts(ops_, a.offsets, E_, ep_, C_, sp, permute);
  ops_.upload_async(a.ep_offsets.data, sp.expert_offsets.data(), sp.expert_offsets.size() * sizeof(int32_t));
  ep_.comm->exchange_pieces({{a.xp.data, a.xe.data, d_, comm_type(ops_.act_dtype())},
                             {a.wp.data, a.we.data, 1, CommType::F32}},
                            sp.by_peer, sp.by_expert, false);
  return sp.recv_rows;
}

void MixtralModel::moe_combine(int l, const Tensor& ye) {
  TraceScope trace("ep combine");
  const EpSplits& sp = ep_splits_[l];
  ep_.comm->exchange_pieces({{ye.data, s_.yp.data, d_, comm_type(ops_.act_dtype())}}, sp.by_expert, sp.by_peer,
                            false);
}

void MixtralModel::moe_dispatch_grad(int l, const Tensor& dye) {
  TraceScope trace("ep dispatch (backward)");
  const EpSplits& sp = ep_splits_[l];
  ep_.comm->exchange_pieces({{s_.dyp.data, dye.data, d_, comm_type(ops_.act_dtype())}}, sp.by_peer, sp.by_expert,
                            false);
}

void MixtralModel::moe_combine_grad(int l, bool start) {
  TraceScope trace(start ? "ep combine (backward, started)" : "ep combine (backward)");
  const EpSplits& sp = ep_splits_[l];
  ep_.comm->exchange_pieces({{s_.dxe.data, s_.dxp.data, d_, comm_type(ops_.act_dtype())},
                             {s_.dwe.data, s_.dwp.data, 1, CommType::F32}},
                            sp.by_expert, sp.by_peer, start);
}

}  // namespace mxt
