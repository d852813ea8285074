// Distributed pieces that need no second process: the rank layout, the expert-parallel splits (checked by
// simulating a whole EP group's all-to-all in memory), the receive capacity, ZeRO-1 shards, the one-rank
// communicator and the collective watchdog. Multi-rank behaviour is tested under mpirun (tests/mpi/).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "dist/dist_internal.hpp"
#include "dist/watchdog.hpp"
#include "mxtrain/comm.hpp"
#include "mxtrain/ops.hpp"

namespace mxt {
namespace {

using ::testing::HasSubstr;

TEST(RankLayout, EpGroupsAreConsecutiveRanks) {
  // dp=2 x ep=2: EP groups {0,1} {2,3}, DP groups {0,2} {1,3}.
  const int expect_ep[4][2] = {{0, 1}, {0, 1}, {2, 3}, {2, 3}};
  const int expect_dp[4][2] = {{0, 2}, {1, 3}, {0, 2}, {1, 3}};
  for (int r = 0; r < 4; ++r) {
    const RankLayout L = make_rank_layout(r, 4, 2, 2);
    EXPECT_EQ(L.ep_rank, r % 2);
    EXPECT_EQ(L.dp_rank, r / 2);
    EXPECT_EQ(L.ep_group(), std::vector<int>(expect_ep[r], expect_ep[r] + 2)) << "rank " << r;
    EXPECT_EQ(L.dp_group(), std::vector<int>(expect_dp[r], expect_dp[r] + 2)) << "rank " << r;
  }
}

TEST(RankLayout, GroupsPartitionTheWorld) {
  for (auto [dp, ep] : {std::pair{1, 4}, {4, 1}, {2, 3}, {3, 2}}) {
    const int W = dp * ep;
    std::map<std::vector<int>, int> ep_groups, dp_groups;
    for (int r = 0; r < W; ++r) {
      const RankLayout L = make_rank_layout(r, W, dp, ep);
      ASSERT_EQ(L.ep_group()[L.ep_rank], r);  // my position in my groups is my rank there
      ASSERT_EQ(L.dp_group()[L.dp_rank], r);
      ++ep_groups[L.ep_group()];
      ++dp_groups[L.dp_group()];
    }
    EXPECT_EQ(static_cast<int>(ep_groups.size()), dp);
    EXPECT_EQ(static_cast<int>(dp_groups.size()), ep);
    for (auto& [g, n] : ep_groups) EXPECT_EQ(n, ep);
    for (auto& [g, n] : dp_groups) EXPECT_EQ(n, dp);
  }
}

TEST(RankLayout, WrongWorldSizeNamesBothKeys) {
  try {
    make_rank_layout(0, 3, 2, 2);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), HasSubstr("parallelism.dp_size (2) x parallelism.ep_size (2)"));
    EXPECT_THAT(e.what(), HasSubstr("(3)"));
  }
}

TEST(EpCapacity, WorstCaseAndFactor) {
  // T=10 tokens, top-2, 8 experts over 4 ranks (2 local): a peer sends at most 10*2 rows here.
  EXPECT_EQ(ep_capacity_rows(10, 2, 8, 4, 0.0), 10 * 2 * 4);
  // One local expert: a token sends at most one of its k rows to a rank.
  EXPECT_EQ(ep_capacity_rows(10, 2, 8, 8, 0.0), 10 * 1 * 8);
  EXPECT_EQ(ep_capacity_rows(10, 2, 8, 4, 1.25), 25);    // ceil(1.25 * 20)
  EXPECT_EQ(ep_capacity_rows(10, 2, 8, 4, 100.0), 80);   // never above the worst case
}

// One rank's permuted rows: (source rank, slot) labels grouped by expert ascending, slots ascending within.
struct RankRows {
  std::vector<int32_t> counts;                 // [E]
  std::vector<std::pair<int, int>> rows;       // (rank, slot)
  std::vector<int> expert;                     // expert of each row
};

RankRows random_routing(int rank, int T, int k, int E, std::mt19937& rng) {
  std::vector<int> idx(static_cast<size_t>(T * k));
  for (int t = 0; t < T; ++t) {
    std::vector<int> all(E);
    for (int e = 0; e < E; ++e) all[e] = e;
    std::shuffle(all.begin(), all.end(), rng);  // k distinct experts per token, as top-k gives
    for (int j = 0; j < k; ++j) idx[t * k + j] = all[j];
  }
  RankRows r;
  r.counts.assign(E, 0);
  for (int e = 0; e < E; ++e)
    for (int s = 0; s < T * k; ++s)
      if (idx[s] == e) {
        r.rows.push_back({rank, s});
        r.expert.push_back(e);
        ++r.counts[e];
      }
  return r;
}

TEST(EpSplits, SimulatedExchangeRoundTrips) {
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 40; ++trial) {
    const int n = 2 + trial % 3, El = 1 + (trial / 3) % 3, E = n * El;
    const int k = 1 + static_cast<int>(rng() % std::min(E, 3)), T = static_cast<int>(rng() % 9);  // T may be 0
    std::vector<RankRows> ranks;
    for (int p = 0; p < n; ++p) ranks.push_back(random_routing(p, T, k, E, rng));
    std::vector<EpSplits> sp(n);
    for (int q = 0; q < n; ++q) {
      std::vector<int32_t> recv_from(static_cast<size_t>(n * El));
      for (int p = 0; p < n; ++p)
        for (int e = 0; e < El; ++e) recv_from[p * El + e] = ranks[p].counts[q * El + e];
      plan_ep_splits(ranks[q].counts, recv_from, n, sp[q]);
    }
    // The all-to-all: rank q receives, from each p, p's rows of q's experts.
    std::vector<std::vector<std::pair<int, int>>> received(n);
    std::vector<std::vector<int>> received_expert(n);
    for (int q = 0; q < n; ++q) {
      received[q].resize(sp[q].recv_rows);
      received_expert[q].resize(sp[q].recv_rows);
      for (int p = 0; p < n; ++p) {
        ASSERT_EQ(sp[p].send_counts[q], sp[q].recv_counts[p]) << "trial " << trial;
        for (int64_t i = 0; i < sp[p].send_counts[q]; ++i) {
          received[q][sp[q].recv_displs[p] + i] = ranks[p].rows[sp[p].send_displs[q] + i];
          received_expert[q][sp[q].recv_displs[p] + i] = ranks[p].expert[sp[p].send_displs[q] + i];
        }
      }
    }
    std::set<std::pair<int, int>> seen;
    for (int q = 0; q < n; ++q) {
      const int32_t* off = sp[q].meta.data();
      const int32_t* order = off + El + 1;
      ASSERT_EQ(off[0], 0);
      ASSERT_EQ(off[El], sp[q].recv_rows);
      // Expert-major: every row in local expert e's range belongs to global expert q*El + e, ordered by
      // (source rank, slot).
      std::vector<std::pair<int, int>> xe(sp[q].recv_rows);
      for (int64_t r = 0; r < sp[q].recv_rows; ++r) xe[r] = received[q][order[r]];
      for (int e = 0; e < El; ++e) {
        for (int32_t r = off[e]; r < off[e + 1]; ++r) {
          EXPECT_EQ(received_expert[q][order[r]], q * El + e) << "trial " << trial;
          if (r > off[e]) {
            EXPECT_LT(xe[r - 1], xe[r]) << "trial " << trial;
          }
          EXPECT_TRUE(seen.insert(xe[r]).second) << "row received twice";
        }
      }
      // combine: scatter back to peer-major order, then the reverse all-to-all restores every rank's rows.
      std::vector<std::pair<int, int>> back(sp[q].recv_rows);
      for (int64_t r = 0; r < sp[q].recv_rows; ++r) back[order[r]] = xe[r];
      EXPECT_EQ(back, received[q]);
    }
    EXPECT_EQ(static_cast<int>(seen.size()), n * T * k);  // every routed row reached its expert once
    for (int p = 0; p < n; ++p) {
      std::vector<std::pair<int, int>> returned(ranks[p].rows.size());
      for (int q = 0; q < n; ++q)
        for (int64_t i = 0; i < sp[q].recv_counts[p]; ++i)
          returned[sp[p].send_displs[q] + i] = received[q][sp[q].recv_displs[p] + i];
      EXPECT_EQ(returned, ranks[p].rows) << "trial " << trial << " rank " << p;
    }
  }
}

TEST(EpSplits, RejectsBadCounts) {
  EpSplits sp;
  EXPECT_THROW(plan_ep_splits({1, 2, 3}, {0, 0, 0}, 2, sp), std::invalid_argument);  // 3 experts over 2
  EXPECT_THROW(plan_ep_splits({1, 2}, {0}, 2, sp), std::invalid_argument);
  EXPECT_THROW(plan_ep_splits({1, -2}, {0, 0}, 2, sp), std::invalid_argument);
}

// A communicator that only knows its rank and size (for shard arithmetic).
class ShapeOnlyComm : public Comm {
 public:
  ShapeOnlyComm(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device device() const override { return Device::CPU; }
  const std::string& name() const override { return name_; }
  void all_to_all_v(const void*, const int64_t*, const int64_t*, void*, const int64_t*, const int64_t*, int64_t,
                    CommType) override {}
  void all_reduce_sum(void*, int64_t, CommType) override {}
  void reduce_scatter_sum(const void*, void*, int64_t, CommType) override {}
  void all_gather(const void*, void*, int64_t, CommType) override {}
  void broadcast(void*, int64_t, CommType, int) override {}
  void reduce_spans(const std::vector<ReduceSpan>& spans, CommType, bool) override {
    seen.insert(seen.end(), spans.begin(), spans.end());
  }
  void barrier() override {}
  std::vector<ReduceSpan> seen;

 private:
  int rank_, size_;
  std::string name_ = "test group";
};

// Per-range reductions: every element of [begin, end) goes to the rank whose shard holds it, once.
TEST(ParamShard, GradRangesReduceToTheirOwners) {
  for (int64_t numel : {7, 1000, 1001}) {
    for (int size : {2, 3, 4}) {
      ShapeOnlyComm c(1, size);
      const ParamShard s = make_param_shard(&c, numel);
      std::vector<float> g(static_cast<size_t>(s.padded));
      const Tensor grad(g.data(), DType::F32, {s.padded});
      const std::vector<int64_t> cuts = {0, 1, numel / 3, numel / 2 + 1, s.padded};  // ranges covering the buffer
      for (size_t i = 0; i + 1 < cuts.size(); ++i) start_reduce_grad_range(s, grad, cuts[i], cuts[i + 1]);
      std::vector<int> hits(g.size(), 0);
      for (const Comm::ReduceSpan& sp : c.seen) {
        const int64_t lo = static_cast<float*>(sp.buf) - g.data();
        ASSERT_GT(sp.count, 0);
        EXPECT_GE(lo, sp.root * s.shard);
        EXPECT_LE(lo + sp.count, (sp.root + 1) * s.shard);
        for (int64_t k = lo; k < lo + sp.count; ++k) ++hits[static_cast<size_t>(k)];
      }
      for (size_t k = 0; k < hits.size(); ++k) ASSERT_EQ(hits[k], 1) << "element " << k << ", size " << size;
    }
  }
  ShapeOnlyComm c(0, 2);
  const ParamShard s = make_param_shard(&c, 10);
  std::vector<float> g(10);
  EXPECT_THROW(start_reduce_grad_range(s, Tensor(g.data(), DType::F32, {10}), 5, 11), std::invalid_argument);
}

TEST(ParamShard, ShardsCoverThePaddedBufferOnce) {
  for (int64_t numel : {1, 7, 8, 1000, 1001}) {
    for (int size : {1, 2, 3, 4}) {
      std::vector<int> owner;
      for (int r = 0; r < size; ++r) {
        ShapeOnlyComm c(r, size);
        const ParamShard s = make_param_shard(&c, numel);
        ASSERT_EQ(s.padded % size, 0);
        ASSERT_GE(s.padded, numel);
        ASSERT_LT(s.padded - numel, size);
        EXPECT_EQ(s.shard * size, s.padded);
        EXPECT_EQ(s.offset, r * s.shard);
        EXPECT_EQ(s.comm != nullptr, size > 1);  // one rank: nothing to shard, no collective
        owner.resize(s.padded, -1);
        for (int64_t i = s.offset; i < s.offset + s.shard; ++i) {
          EXPECT_EQ(owner[i], -1);
          owner[i] = r;
        }
      }
      EXPECT_EQ(std::count(owner.begin(), owner.end(), -1), 0);
    }
  }
}

TEST(SelfComm, CopiesOnTheHostAndIsInPlaceOtherwise) {
  auto c = make_self_comm(Device::CPU, "self");
  std::vector<float> src = {1, 2, 3, 4, 5, 6}, dst(6, 0.f);
  const int64_t cnt[1] = {2}, sd[1] = {1}, rd[1] = {0};
  c->all_to_all_v(src.data(), cnt, sd, dst.data(), cnt, rd, 2, CommType::F32);  // rows of 2: rows 1..2
  EXPECT_EQ(dst, (std::vector<float>{3, 4, 5, 6, 0, 0}));
  c->all_gather(src.data(), dst.data(), 6, CommType::F32);
  EXPECT_EQ(dst, src);
  auto dev = make_self_comm(Device::CUDA, "self");
  dev->reduce_scatter_sum(src.data(), src.data(), 6, CommType::F32);  // in place: no device access
  EXPECT_THROW(dev->all_gather(src.data(), dst.data(), 6, CommType::F32), std::logic_error);
}

// One EP rank: every routed row stays here; the statistics count each exchange, the rows and the largest layer.
TEST(EpExchange, StatisticsCountRowsAndExchanges) {
  auto ops = make_cpu_ops();
  auto self = make_self_comm(Device::CPU, "ep");
  ExpertParallel ep;
  ep.comm = self.get();
  ep.host = self.get();
  const EpExchangeStats before = ep_exchange_stats();
  std::vector<int32_t> off = {0, 3, 3, 10, 12};  // 4 experts, 12 rows, expert 1 empty
  EpSplits sp;
  exchange_expert_counts(*ops, Tensor(off.data(), DType::I32, {5}), 4, ep, 100, sp);
  EXPECT_EQ(sp.recv_rows, 12);
  off = {0, 1, 2, 3, 40};
  exchange_expert_counts(*ops, Tensor(off.data(), DType::I32, {5}), 4, ep, 100, sp);
  const EpExchangeStats& after = ep_exchange_stats();
  EXPECT_EQ(after.exchanges - before.exchanges, 2);
  EXPECT_EQ(after.rows_sent - before.rows_sent, 52);
  EXPECT_EQ(after.rows_received - before.rows_received, 52);
  EXPECT_GE(after.max_received, 40);
  EXPECT_GE(after.download_s, before.download_s);
  EXPECT_GE(after.peer_wait_s, before.peer_wait_s);
  // Too many rows for the receive buffers: an error naming the key, and nothing is counted.
  EXPECT_THAT([&] { exchange_expert_counts(*ops, Tensor(off.data(), DType::I32, {5}), 4, ep, 39, sp); },
              ::testing::ThrowsMessage<std::runtime_error>(HasSubstr("parallelism.ep_capacity_factor")));
  EXPECT_EQ(ep_exchange_stats().exchanges - before.exchanges, 2);
}

// ---- watchdog -------------------------------------------------------------------------------------------

struct Fired {
  std::mutex mu;
  std::vector<std::string> messages;
  Watchdog::Fire fn() {
    return [this](const std::string& m) {
      std::lock_guard<std::mutex> l(mu);
      messages.push_back(m);
    };
  }
  size_t count() {
    std::lock_guard<std::mutex> l(mu);
    return messages.size();
  }
};

using namespace std::chrono_literals;

TEST(Watchdog, FiresWhenAHostCollectiveOverruns) {
  Fired f;
  Watchdog w(0.2, f.fn(), 0.01);
  {
    auto g = w.guard("MPI all_to_all_v on the ep group (world ranks 0,1)");
    std::this_thread::sleep_for(500ms);
  }
  ASSERT_EQ(f.count(), 1u);  // once, not at every poll
  EXPECT_THAT(f.messages[0], HasSubstr("MPI all_to_all_v on the ep group (world ranks 0,1)"));
  EXPECT_THAT(f.messages[0], HasSubstr("parallelism.timeout_s=0.2"));
}

TEST(Watchdog, QuietWhenCollectivesFinishInTime) {
  Fired f;
  Watchdog w(0.3, f.fn(), 0.01);
  for (int i = 0; i < 20; ++i) {
    auto g = w.guard("barrier");
    std::this_thread::sleep_for(20ms);
  }
  std::atomic<bool> done{false};
  w.watch("NCCL all_reduce_sum", [&] { return done.load(); });
  std::this_thread::sleep_for(100ms);
  done = true;
  std::this_thread::sleep_for(400ms);
  EXPECT_EQ(f.count(), 0u);
  EXPECT_EQ(w.pending(), 0u);  // finished operations are forgotten
}

TEST(Watchdog, FiresWhenAnAsynchronousCollectiveNeverCompletes) {
  Fired f;
  Watchdog w(0.15, f.fn(), 0.01);
  w.watch("NCCL reduce_scatter_sum on the world group", [] { return false; });
  std::this_thread::sleep_for(400ms);
  ASSERT_EQ(f.count(), 1u);
  EXPECT_THAT(f.messages[0], HasSubstr("NCCL reduce_scatter_sum on the world group"));
}

TEST(Watchdog, HealthCheckErrorFiresAtOnce) {
  Fired f;
  Watchdog w(1000, f.fn(), 0.01);
  std::atomic<bool> broken{false};
  w.add_health_check([&] { return broken ? std::string("NCCL error on the dp group: remote process exited") : ""; });
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(f.count(), 0u);
  broken = true;
  std::this_thread::sleep_for(200ms);
  ASSERT_EQ(f.count(), 1u);
  EXPECT_THAT(f.messages[0], HasSubstr("remote process exited"));
}

TEST(Watchdog, RemovedHealthCheckIsNeverCalledAgain) {
  Fired f;
  Watchdog w(1000, f.fn(), 0.01);
  std::atomic<int> calls{0};
  const uint64_t id = w.add_health_check([&] {
    ++calls;
    return std::string();
  });
  std::this_thread::sleep_for(100ms);
  EXPECT_GT(calls.load(), 0);
  w.remove_health_check(id);
  const int after = calls.load();
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(calls.load(), after);
}

TEST(Watchdog, DisabledWithNonPositiveTimeout) {
  Fired f;
  Watchdog w(0, f.fn(), 0.01);
  { auto g = w.guard("x"); }
  w.watch("y", [] { return false; });
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(w.pending(), 0u);
  EXPECT_EQ(f.count(), 0u);
}

}  // namespace
}  // namespace mxt
