// Expert parallelism's bookkeeping: the receive capacity, and the splits of the token all-to-all derived from
// the per-expert counts, which is where routing decisions reach the host (one download per MoE layer).
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>

#include "mxtrain/comm.hpp"
#include "mxtrain/ops.hpp"

namespace mxt {

namespace {
EpExchangeStats g_stats;  // the exchanges run on the training thread only
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

const EpExchangeStats& ep_exchange_stats() { return g_stats; }
void reset_ep_exchange_stats() { g_stats = EpExchangeStats{}; }

void log_ep_exchange_stats(Comm& world) {
  const EpExchangeStats& s = g_stats;
  constexpr int kFields = 8;
  const double mine[kFields] = {static_cast<double>(s.exchanges),     static_cast<double>(s.rows_sent),
                                static_cast<double>(s.rows_received), static_cast<double>(s.max_received),
                                s.download_s,                         s.peer_wait_s,
                                static_cast<double>(s.busiest_rows),  static_cast<double>(s.mean_rows)};
  std::vector<double> all(static_cast<size_t>(kFields * world.size()));
  world.all_gather(mine, all.data(), kFields, CommType::F64);
  if (world.rank() != 0) return;
  if (all[0] > 0 && all[7] > 0)  // the same on every rank of an EP group: rank 0's view
    spdlog::info("EP load: the busiest EP rank's experts received {:.0f} rows per layer on average, the mean rank "
                 "{:.0f}: the experts' critical path is {:.3f}x a balanced one", all[6] / all[0], all[7] / all[0],
                 all[6] / all[7]);
  for (int r = 0; r < world.size(); ++r) {
    const double* v = all.data() + r * kFields;
    if (v[0] == 0) continue;
    spdlog::info("EP exchanges (after the first step), world rank {}: {:.0f} layers x micro-batches; rows per layer sent {:.0f}, received "
                 "{:.0f} (max {:.0f}); host waited {:.3f} s for the device (counts download) and {:.3f} s for the "
                 "peers (count exchange)", r, v[0], v[1] / v[0], v[2] / v[0], v[3], v[4], v[5]);
  }
}

// Worst case: every one of a peer's T tokens sends min(k, El) of its k (distinct) experts' rows here.
int64_t ep_capacity_rows(int64_t tokens, int64_t k, int64_t num_experts, int ep_size, double capacity_factor) {
  const int64_t local = num_experts / ep_size;
  const int64_t worst = tokens * std::min(k, local) * ep_size;
  if (capacity_factor <= 0) return std::max<int64_t>(worst, 1);
  const double want = std::ceil(capacity_factor * static_cast<double>(tokens * k));
  return std::max<int64_t>(1, std::min<int64_t>(worst, static_cast<int64_t>(want)));
}

void plan_ep_splits(const std::vector<int32_t>& my_counts, const std::vector<int32_t>& recv_from, int ep_size,
                    EpSplits& out) {
  const int64_t E = static_cast<int64_t>(my_counts.size());
  if (ep_size < 1 || E % ep_size != 0)
    throw std::invalid_argument(fmt::format("plan_ep_splits: {} experts over {} EP ranks", E, ep_size));
  const int64_t El = E / ep_size;
  if (static_cast<int64_t>(recv_from.size()) != ep_size * El)
    throw std::invalid_argument(fmt::format("plan_ep_splits: {} received counts, expected {}", recv_from.size(),
                                            ep_size * El));
  for (int32_t c : my_counts)
    if (c < 0) throw std::invalid_argument("plan_ep_splits: negative expert count");
  for (int32_t c : recv_from)
    if (c < 0) throw std::invalid_argument("plan_ep_splits: negative received count");
  out.send_counts.assign(ep_size, 0);
  out.send_displs.assign(ep_size, 0);
  out.recv_counts.assign(ep_size, 0);
  out.recv_displs.assign(ep_size, 0);
  // My permuted rows are grouped by global expert in ascending order, so peer p's rows (its experts
  // [p*El, (p+1)*El)) are one contiguous run.
  int64_t s = 0, r = 0;
  for (int p = 0; p < ep_size; ++p) {
    out.send_displs[p] = s;
    for (int64_t e = 0; e < El; ++e) out.send_counts[p] += my_counts[p * El + e];
    s += out.send_counts[p];
    out.recv_displs[p] = r;
    for (int64_t e = 0; e < El; ++e) out.recv_counts[p] += recv_from[p * El + e];
    r += out.recv_counts[p];
  }
  out.recv_rows = r;
  // Received rows arrive peer-major (peer p's block ordered by expert); the grouped GEMMs need them
  // expert-major: for each local expert e, peer 0's rows of e, then peer 1's, ...
  out.meta.assign(static_cast<size_t>(El + 1 + r), 0);
  int32_t* off = out.meta.data();
  int32_t* order = off + El + 1;
  int64_t q = 0;
  for (int64_t e = 0; e < El; ++e) {
    for (int p = 0; p < ep_size; ++p) {
      int64_t base = out.recv_displs[p];
      for (int64_t e2 = 0; e2 < e; ++e2) base += recv_from[p * El + e2];
      for (int32_t i = 0; i < recv_from[p * El + e]; ++i) order[q++] = static_cast<int32_t>(base + i);
    }
    off[e + 1] = static_cast<int32_t>(q);
  }
}

void exchange_expert_counts(Ops& ops, const Tensor& offsets, int64_t num_experts, const ExpertParallel& ep,
                            int64_t capacity_rows, EpSplits& out, const std::function<void()>& meanwhile) {
  const int64_t E = num_experts, El = E / ep.size;
  std::vector<int32_t> off(static_cast<size_t>(E + 1)), mine(static_cast<size_t>(E)), theirs(static_cast<size_t>(E));
  auto t0 = std::chrono::steady_clock::now();
  ops.download_overlapped(off.data(), offsets.data, off.size() * sizeof(int32_t), meanwhile);
  g_stats.download_s += seconds_since(t0);
  for (int64_t e = 0; e < E; ++e) mine[e] = off[e + 1] - off[e];
  // Every rank's counts of every expert: all[p * E + e]. I keep what peers send to my experts [rank*El, +El).
  std::vector<int32_t> all(static_cast<size_t>(ep.size * E));
  t0 = std::chrono::steady_clock::now();
  ep.host->all_gather(mine.data(), all.data(), E, CommType::I32);
  g_stats.peer_wait_s += seconds_since(t0);
  int64_t busiest = 0, total = 0;
  for (int r = 0; r < ep.size; ++r) {
    int64_t rows = 0;
    for (int p = 0; p < ep.size; ++p)
      for (int64_t e = 0; e < El; ++e) rows += all[static_cast<size_t>(p * E + r * El + e)];
    busiest = std::max(busiest, rows);
    total += rows;
  }
  for (int p = 0; p < ep.size; ++p)
    for (int64_t e = 0; e < El; ++e)
      theirs[static_cast<size_t>(p * El + e)] = all[static_cast<size_t>(p * E + ep.rank * El + e)];
  plan_ep_splits(mine, theirs, ep.size, out);
  out.expert_rows.assign(static_cast<size_t>(E), 0);
  for (int p = 0; p < ep.size; ++p)
    for (int64_t e = 0; e < E; ++e) out.expert_rows[static_cast<size_t>(e)] += all[static_cast<size_t>(p * E + e)];
  if (out.recv_rows > capacity_rows)
    throw std::runtime_error(fmt::format(
        "expert parallelism: EP rank {} receives {} routed rows for its experts, more than its buffers hold ({} "
        "rows, parallelism.ep_capacity_factor={}); raise parallelism.ep_capacity_factor, or set it to 0 for the "
        "worst case", ep.rank, out.recv_rows, capacity_rows, ep.capacity_factor));
  ++g_stats.exchanges;
  g_stats.busiest_rows += busiest;
  g_stats.mean_rows += total / ep.size;
  for (int64_t c : out.send_counts) g_stats.rows_sent += c;
  g_stats.rows_received += out.recv_rows;
  g_stats.max_received = std::max(g_stats.max_received, out.recv_rows);
}

}  // namespace mxt
