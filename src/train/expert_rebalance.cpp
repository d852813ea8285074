// parallelism.ep_rebalance_interval: after every N-th step each layer's experts are re-placed over the EP ranks
// by the rows they received in that step (balance_experts), so that the busiest rank, which every other rank
// waits for at the combine, holds less. A move relabels experts: router row, fp32 master and AdamW moments go
// together, the bf16 / MXFP8 copies are rebuilt, and the model's function is unchanged. Only that one step's
// rows decide, so a run resumed from a checkpoint decides as the uninterrupted run did.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <stdexcept>
#include <string>

#include "mxtrain/bf16.hpp"
#include "mxtrain/expert_placement.hpp"
#include "mxtrain/model.hpp"
#include "mxtrain/trainer.hpp"

namespace mxt {

namespace {
// Smaller gains move nothing: a move costs a pass over the layer's expert state.
constexpr double kMinGain = 0.03;

std::string layer_name(int64_t l, const char* what) {
  return "model.layers." + std::to_string(l) + ".block_sparse_moe." + what;
}

// A buffer holding elements [begin, begin + t.numel()) of a flat parameter range (a ZeRO shard, or all of it).
struct Span {
  Tensor t;
  int64_t begin;
};
// The per-expert optimizer state that a move carries: fp32 master (whole) and the AdamW moments (possibly a DP shard).
std::array<Span, 3> expert_state(const FlatParams& e) {
  return {{{e.master, 0}, {e.adam_m, e.shard_offset}, {e.adam_v, e.shard_offset}}};
}
}  // namespace

void Trainer::rebalance_experts() {
  const int P = groups_->layout.ep_size;
  const int64_t L = cfg_.model.num_hidden_layers, E = cfg_.model.num_local_experts;
  // Every EP group saw its own tokens: sum over the DP replicas, so that all ranks place alike (the router rows
  // are replicated over the world).
  std::vector<int64_t> rows = model_->expert_rows();
  std::vector<double> sum(rows.begin(), rows.end());
  groups_->dp_host->all_reduce_sum(sum.data(), static_cast<int64_t>(sum.size()), CommType::F64);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int64_t>(sum[i]);
  std::vector<std::vector<int>> src(static_cast<size_t>(L));
  double before = 0, after = 0, mean = 0;
  int moved = 0, layers = 0;
  for (int64_t l = 0; l < L; ++l) {
    const std::vector<int64_t> r(rows.begin() + l * E, rows.begin() + (l + 1) * E);
    const ExpertMoves m = balance_experts(r, P, kMinGain, expert_shard_.comm != nullptr);
    src[static_cast<size_t>(l)] = m.src;
    before += static_cast<double>(m.busiest_before);
    after += static_cast<double>(m.busiest_after);
    for (int64_t x : r) mean += static_cast<double>(x) / P;
    moved += m.moved;
    layers += m.moved > 0;
  }
  if (moved == 0) {
    if (rank_ == 0 && mean > 0)
      spdlog::debug("EP rebalance after step {}: nothing to gain (busiest EP rank {:.3f}x the mean)", step_,
                    before / mean);
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  // MXTRAIN_CHECK_REBALANCE=1: every slot's state after the move equals its source slot's before it.
  const bool self_check = std::getenv("MXTRAIN_CHECK_REBALANCE") != nullptr;
  const std::vector<double> sums_before = self_check ? expert_slot_sums() : std::vector<double>{};
  permute_router_rows(src);
  move_expert_slots(src);
  if (self_check) {
    const std::vector<double> sums_after = expert_slot_sums();
    const int64_t roles = static_cast<int64_t>(sums_after.size()) / (L * E);
    int64_t bad = 0;
    for (int64_t r = 0; r < roles; ++r)
      for (int64_t l = 0; l < L; ++l)
        for (int64_t g = 0; g < E; ++g)
          bad += sums_after[(r * L + l) * E + g] != sums_before[(r * L + l) * E + src[static_cast<size_t>(l)][g]];
    if (bad) throw std::logic_error("MXTRAIN_CHECK_REBALANCE: " + std::to_string(bad) + " slot states differ from their sources");
    if (rank_ == 0) spdlog::info("MXTRAIN_CHECK_REBALANCE: every moved slot holds its source's state");
  }
  refresh_working_weights();
  if (self_check) check_working_copies();
  ops_.synchronize();
  std::vector<int32_t> origin(expert_origin_.size());
  for (int64_t l = 0; l < L; ++l)
    for (int64_t g = 0; g < E; ++g)
      origin[static_cast<size_t>(l * E + g)] = expert_origin_[static_cast<size_t>(l * E + src[static_cast<size_t>(l)][g])];
  expert_origin_.swap(origin);
  experts_moved_ += moved;
  if (rank_ == 0)
    spdlog::info("EP rebalance after step {}: {} experts re-placed in {} of {} layers in {:.2f} s; by this step's "
                 "routing the busiest EP rank's rows go from {:.3f}x to {:.3f}x the mean", step_, moved, layers, L,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), before / mean,
                 after / mean);
}

// Per slot [role][layer][global slot]: the sums of its fp32 master, AdamW moments and router row, gathered over
// the EP group (host, for MXTRAIN_CHECK_REBALANCE).
std::vector<double> Trainer::expert_slot_sums() {
  const int P = groups_->layout.ep_size;
  const int64_t L = cfg_.model.num_hidden_layers, E = cfg_.model.num_local_experts, El = E / P;
  std::vector<float> m;
  std::vector<double> mine;
  // The moments may be this DP replica's shard: a slot's sum covers the part of it held here (the same flat
  // range before and after a move, which keeps slot indexes then).
  for (const auto& [R, begin] : expert_state(expert_)) {
    m.resize(static_cast<size_t>(R.numel()));
    download_f32(ops_, R, 0, R.numel(), m.data());
    const int64_t end = begin + R.numel();
    for (int64_t l = 0; l < L; ++l)
      for (int64_t j = 0; j < El; ++j) {
        double s = 0;
        for (const char* what : {"experts.w13", "experts.w2"}) {
          const ParamInfo& p = layout_.find(layer_name(l, what));
          const int64_t per = p.numel / El;
          for (int64_t i = std::max<int64_t>(0, begin - p.offset - j * per);
               i < std::min(per, end - p.offset - j * per); ++i)
            s += m[static_cast<size_t>(p.offset + j * per + i - begin)] * (1.0 + 1e-3 * (i % 7));
        }
        mine.push_back(s);
      }
  }
  std::vector<double> all(mine.size() * static_cast<size_t>(P));
  groups_->ep_host->all_gather(mine.data(), all.data(), static_cast<int64_t>(mine.size()), CommType::F64);
  std::vector<double> out(3 * static_cast<size_t>(L * E));  // [role][l][g], g = rank * El + j
  for (int q = 0; q < P; ++q)
    for (int64_t r = 0; r < 3; ++r)
      for (int64_t l = 0; l < L; ++l)
        for (int64_t j = 0; j < El; ++j)
          out[static_cast<size_t>((r * L + l) * E + q * El + j)] =
              all[static_cast<size_t>(q) * mine.size() + static_cast<size_t>((r * L + l) * El + j)];
  std::vector<float> d;
  master_weights(d, m);  // collective: the whole dense master
  for (int64_t l = 0; l < L; ++l) {
    const ParamInfo& p = layout_.find(layer_name(l, "gate.weight"));
    const int64_t d_model = p.numel / E;
    for (int64_t g = 0; g < E; ++g) {
      double s = 0;
      for (int64_t i = 0; i < d_model; ++i) s += d[static_cast<size_t>(p.offset + g * d_model + i)] * (1.0 + 1e-3 * (i % 7));
      out.push_back(s);
    }
  }
  return out;
}

// MXTRAIN_CHECK_REBALANCE: the working copies the model reads equal their fp32 masters, rounded.
void Trainer::check_working_copies() {
  std::vector<float> dense, expert;
  master_weights(dense, expert);
  auto check = [&](const Tensor& working, const std::vector<float>& master, const char* what) {
    if (!working.data || working.dtype == DType::F32) return;
    const int64_t n = std::min<int64_t>(working.numel(), static_cast<int64_t>(master.size()));
    const Tensor tmp = expert_.grad.rows(0, n);  // free between steps
    ops_.copy(working.rows(0, n), tmp);
    std::vector<float> w(static_cast<size_t>(n));
    ops_.download(w.data(), tmp.data, w.size() * sizeof(float));
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) bad += w[static_cast<size_t>(i)] != round_to_bf16(master[static_cast<size_t>(i)]);
    if (bad) throw std::logic_error(std::string("MXTRAIN_CHECK_REBALANCE: ") + std::to_string(bad) + " of " +
                                    std::to_string(n) + " " + what + " working-copy elements differ from the master");
  };
  if (expert_.grad.numel() >= layout_.dense_numel) check(dense_.working, dense, "dense");
  check(expert_.working, expert, "expert");
}

// Router rows live in the dense buffers, sharded over the world (ZeRO-1): every rank contributes its part of
// each layer's [E, d] block, all see the whole block, permute it, and write back their part.
void Trainer::permute_router_rows(const std::vector<std::vector<int>>& src) {
  const int64_t L = cfg_.model.num_hidden_layers, E = cfg_.model.num_local_experts, d = cfg_.model.hidden_size;
  const int64_t block = E * d;
  struct Part : Span {
    bool replicated;  // every rank holds it whole: only rank 0 contributes to the sum
  };
  const bool sharded = dense_shard_.comm != nullptr;
  const Part parts[] = {{{dense_.master, dense_master_sharded_ ? dense_shard_.offset : 0}, !dense_master_sharded_},
                        {{dense_.adam_m, dense_.shard_offset}, !sharded},
                        {{dense_.adam_v, dense_.shard_offset}, !sharded}};
  std::vector<float> host(static_cast<size_t>(3 * L * block), 0.f);
  // fn(part, host run, first element of the run in the part's buffer, elements)
  auto each_span = [&](const std::function<void(const Part&, float*, int64_t, int64_t)>& fn) {
    for (int b = 0; b < 3; ++b) {
      const Part& p = parts[b];
      for (int64_t l = 0; l < L; ++l) {
        const int64_t off = layout_.find(layer_name(l, "gate.weight")).offset;
        const int64_t lo = std::max(off, p.begin), hi = std::min(off + block, p.begin + p.t.numel());
        if (lo >= hi) continue;
        fn(p, host.data() + (b * L + l) * block + (lo - off), lo - p.begin, hi - lo);
      }
    }
  };
  each_span([&](const Part& p, float* h, int64_t at, int64_t n) {
    if (p.replicated && rank_ != 0) return;
    download_f32(ops_, p.t, at, n, h);
  });
  groups_->world_host->all_reduce_sum(host.data(), static_cast<int64_t>(host.size()), CommType::F32);
  std::vector<float> permuted(host.size());
  for (int64_t b = 0; b < 3 * L; ++b) {
    const std::vector<int>& s = src[static_cast<size_t>(b % L)];
    for (int64_t g = 0; g < E; ++g)
      std::copy_n(host.begin() + b * block + s[static_cast<size_t>(g)] * d, d, permuted.begin() + b * block + g * d);
  }
  host.swap(permuted);
  each_span([&](const Part& p, float* h, int64_t at, int64_t n) { upload_f32(ops_, p.t, at, n, h); });
}

// Expert state moves between EP ranks with one all-to-all per (layer, tensor, role, d x f unit), staged in the
// expert gradient buffer, which is free between steps. The fp32 master is whole on every rank; the AdamW moments
// may be sharded by flat range over DP replicas, and then experts keep their slot index (balance_experts
// same_slot), so a slot's part of every shard sits at the same flat range on the sending and the receiving rank.
void Trainer::move_expert_slots(const std::vector<std::vector<int>>& src) {
  const int P = groups_->layout.ep_size, me = groups_->layout.ep_rank;
  const int64_t L = cfg_.model.num_hidden_layers, E = cfg_.model.num_local_experts, El = E / P;
  const int64_t unit = cfg_.model.hidden_size * cfg_.model.intermediate_size;
  const bool sharded = expert_shard_.comm != nullptr;
  if (2 * El * unit > expert_.grad.numel())
    throw std::logic_error("move_expert_slots: the expert gradient buffer cannot stage one layer's moves");
  const Tensor send = expert_.grad.rows(0, El * unit), recv = expert_.grad.rows(El * unit, El * unit);
  Comm& comm = *groups_->ep;
  for (int64_t l = 0; l < L; ++l) {
    const std::vector<int>& s = src[static_cast<size_t>(l)];
    bool any = false;  // a layer that moves nothing skips its collectives on every rank alike
    for (int64_t g = 0; g < E; ++g) any = any || s[static_cast<size_t>(g)] != g;
    if (!any) continue;
    // out[q]: my slots whose experts go to peer q, in the order of their new slots there; in[q]: my slots that
    // receive from peer q, in order. Moves always cross ranks (balance_experts keeps a staying expert's slot).
    std::vector<std::vector<int64_t>> out(static_cast<size_t>(P)), in(static_cast<size_t>(P));
    for (int64_t g = 0; g < E; ++g) {
      const int64_t from = s[static_cast<size_t>(g)];
      if (from == g) continue;
      if (from / El == g / El) throw std::logic_error("move_expert_slots: a move within one rank");
      if (sharded && from % El != g % El)
        throw std::logic_error("move_expert_slots: a move between slot indexes with DP-sharded moments");
      if (from / El == me) out[static_cast<size_t>(g / El)].push_back(from % El);
      if (g / El == me) in[static_cast<size_t>(from / El)].push_back(g % El);
    }
    for (const char* what : {"experts.w13", "experts.w2"}) {
      const ParamInfo& p = layout_.find(layer_name(l, what));
      const int64_t per = p.numel / El;
      for (const Span& R : expert_state(expert_)) {
        for (int64_t u = 0; u < per / unit; ++u) {
          // slot j's part of this unit held in R: elements [lo, hi) of the flat buffer
          auto part = [&](int64_t j) {
            const int64_t a = p.offset + j * per + u * unit;
            const int64_t lo = std::max(a, R.begin), hi = std::min(a + unit, R.begin + R.t.numel());
            return hi > lo ? R.t.rows(lo - R.begin, hi - lo) : R.t.rows(0, 0);
          };
          std::vector<int64_t> sc(P, 0), sd(P, 0), rc(P, 0), rd(P, 0);
          int64_t ns = 0, nr = 0;
          for (int q = 0; q < P; ++q) {
            sd[q] = ns;
            for (int64_t j : out[q]) {
              const Tensor t = part(j);
              if (t.numel() > 0) ops_.copy(t, send.rows(ns, t.numel()));
              ns += t.numel();
            }
            sc[q] = ns - sd[q];
            rd[q] = nr;
            for (int64_t j : in[q]) nr += part(j).numel();
            rc[q] = nr - rd[q];
          }
          comm.all_to_all_v(send.data, sc.data(), sd.data(), recv.data, rc.data(), rd.data(), 1, CommType::F32);
          int64_t at = 0;
          for (int q = 0; q < P; ++q)
            for (int64_t j : in[q]) {
              const Tensor t = part(j);
              if (t.numel() > 0) ops_.copy(recv.rows(at, t.numel()), t);
              at += t.numel();
            }
        }
      }
    }
  }
}

}  // namespace mxt
