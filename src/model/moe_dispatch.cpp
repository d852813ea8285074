// Expert parallelism's two MoE stages. dispatch: this rank's permuted rows (grouped by global expert) go to
// the EP ranks that own their experts, with their routing weights (one exchange); the received rows (peer-major)
// are then reordered expert-major for the grouped GEMMs. combine: the reverse. The backward runs the same exchanges
// with the splits swapped: combine's backward is a dispatch of the output gradient, dispatch's backward a
// combine of the input and routing-weight gradients. The splits come from exchange_expert_counts, the one
// place where routing reaches the host, once per layer per forward; the backward reuses them. With
// parallelism.ep_overlap the backward's combine is started before the experts' w13 weight gradient, which runs
// alongside it on the compute stream (moe_block.cpp), with a few multiprocessors left to the exchange.
#include "mxtrain/model.hpp"
#include "mxtrain/trace.hpp"

namespace mxt {

int64_t MixtralModel::moe_dispatch(int l, const std::function<void()>& permute) {
  TraceScope trace("ep dispatch");
  LayerActs& a = acts_[l];
  EpSplits& sp = ep_splits_[l];
  // The permutation runs on the device while the host waits for the counts and exchanges them.
  exchange_expert_counts(ops_, a.offsets, E_, ep_, C_, sp, permute);
  const int64_t n = sp.recv_rows;
  ops_.upload_async(a.ep_meta.data, sp.meta.data(), sp.meta.size() * sizeof(int32_t));
  ep_.comm->exchange_rows({{a.xp.data, s_.ep_rows.data, d_, comm_type(ops_.act_dtype())},
                           {a.wp.data, s_.ep_w.data, 1, CommType::F32}},
                          sp.send_counts.data(), sp.send_displs.data(), sp.recv_counts.data(),
                          sp.recv_displs.data(), false);
  if (n > 0) {  // peer-major -> expert-major: xe[q] = ep_rows[order[q]]
    const Tensor order = a.ep_meta.rows(El_ + 1, n);
    ops_.moe_permute(s_.ep_rows.rows(0, n), order, 1, a.xe.rows(0, n));
    ops_.moe_permute_weights(s_.ep_w.rows(0, n), order, a.we.rows(0, n));
  }
  return n;
}

void MixtralModel::moe_combine(int l, const Tensor& ye) {
  TraceScope trace("ep combine");
  const LayerActs& a = acts_[l];
  const EpSplits& sp = ep_splits_[l];
  const int64_t n = sp.recv_rows;
  if (n > 0) ops_.moe_unpermute(ye, a.ep_meta.rows(El_ + 1, n), 1, s_.ep_rows.rows(0, n));  // back to peer-major
  ep_.comm->all_to_all_v(s_.ep_rows.data, sp.recv_counts.data(), sp.recv_displs.data(), s_.yp.data,
                         sp.send_counts.data(), sp.send_displs.data(), d_, comm_type(ops_.act_dtype()));
}

void MixtralModel::moe_dispatch_grad(int l, const Tensor& dye) {
  TraceScope trace("ep dispatch (backward)");
  const LayerActs& a = acts_[l];
  const EpSplits& sp = ep_splits_[l];
  const int64_t n = sp.recv_rows;
  ep_.comm->all_to_all_v(s_.dyp.data, sp.send_counts.data(), sp.send_displs.data(), s_.ep_rows.data,
                         sp.recv_counts.data(), sp.recv_displs.data(), d_, comm_type(ops_.act_dtype()));
  if (n > 0) ops_.moe_permute(s_.ep_rows.rows(0, n), a.ep_meta.rows(El_ + 1, n), 1, dye.rows(0, n));
}

void MixtralModel::moe_combine_grad(int l, bool start) {
  TraceScope trace(start ? "ep combine (backward, started)" : "ep combine (backward)");
  const LayerActs& a = acts_[l];
  const EpSplits& sp = ep_splits_[l];
  const int64_t n = sp.recv_rows;
  if (n > 0) {
    const Tensor order = a.ep_meta.rows(El_ + 1, n);
    ops_.moe_unpermute(s_.dxe.rows(0, n), order, 1, s_.ep_rows.rows(0, n));
    ops_.moe_unpermute_weights(s_.dwe.rows(0, n), order, s_.ep_w.rows(0, n));
  }
  ep_.comm->exchange_rows({{s_.ep_rows.data, s_.dxp.data, d_, comm_type(ops_.act_dtype())},
                           {s_.ep_w.data, s_.dwp.data, 1, CommType::F32}},
                          sp.recv_counts.data(), sp.recv_displs.data(), sp.send_counts.data(),
                          sp.send_displs.data(), start);
}

}  // namespace mxt
