// Checkpoint building blocks: the XXH64 checksum against reference values, the flat-buffer <-> expert-block
// mapping, the manifest's tiling checks, and resharding: state saved by 1, 2 or 4 ranks (EP, DP with ZeRO-1
// moments) loads bit for bit into every other layout. Ranks are threads sharing an in-memory CkptComm.
#include <gtest/gtest.h>

#include <cmath>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <thread>

#include "ckpt/ckpt_internal.hpp"
#include "mxtrain/backend.hpp"
#include "mxtrain/bf16.hpp"
#include "mxtrain/checkpoint.hpp"
#include "mxtrain/data.hpp"
#include "mxtrain/ops.hpp"
#include "mxtrain/params.hpp"
#include "mxtrain/version.hpp"
#include "tiny_config.hpp"

namespace mxt {
namespace {

using mxt::testing::tiny_model;

namespace fs = std::filesystem;
using namespace ckpt;

TEST(CheckpointHash, MatchesReferenceXxh64) {
  // Reference values from libxxhash 0.8.1 (XXH64, seed 0).
  const std::pair<std::string, const char*> cases[] = {
      {"", "ef46db3751d8e999"},
      {"a", "d24ec4f1a98c6e5b"},
      {"abc", "44bc2cf5ad770999"},
      {"Nobody inspects the spammish repetition", "fbcea83c8a378bf1"},
      {std::string(100, 'x') + "0123456789abcdef" + std::string(37, 'y'), "52bca52ef68142b1"}};
  for (const auto& [in, want] : cases) EXPECT_EQ(hex64(hash64(in.data(), in.size())), want) << "'" << in << "'";
}

TEST(CheckpointHash, StreamingEqualsOneShotAndEveryByteCounts) {
  std::mt19937_64 rng(7);
  std::vector<unsigned char> buf(10007);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
  const uint64_t whole = hash64(buf.data(), buf.size());
  for (int trial = 0; trial < 20; ++trial) {
    Hasher64 h;
    size_t at = 0;
    while (at < buf.size()) {
      const size_t n = std::min<size_t>(buf.size() - at, rng() % 70);
      h.update(buf.data() + at, n);
      at += n;
    }
    EXPECT_EQ(h.digest(), whole);
  }
  for (size_t i = 0; i < buf.size(); i += 997) {
    auto copy = buf;
    copy[i] ^= 0x10;
    EXPECT_NE(hash64(copy.data(), copy.size()), whole) << "flipped byte " << i;
  }
}


TEST(CheckpointSegments, ExpertRangesMapOntoBlocksExactlyOnce) {
  const ParamLayout L = ParamLayout::build(tiny_model(), 2, 2);  // experts 2 and 3
  const int64_t N = L.expert_numel, B = expert_block_numel(L);
  ASSERT_EQ(B * 2, N);
  std::mt19937_64 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    int64_t u = static_cast<int64_t>(rng() % (N + 1)), v = static_cast<int64_t>(rng() % (N + 1));
    if (u > v) std::swap(u, v);
    if (trial == 0) u = 0, v = N;
    std::vector<int> seen(static_cast<size_t>(N), 0);
    int64_t total = 0;
    for (const Segment& s : expert_segments(L, 1, nullptr, 0, u, v)) {
      const int64_t g = std::stoll(s.key.substr(7));
      EXPECT_TRUE(g == 2 || g == 3) << s.key;
      EXPECT_EQ(s.key.substr(s.key.size() - 7), ".adam_m");
      int64_t sum = 0;
      for (const Piece& p : s.pieces) {
        for (int64_t i = p.offset; i < p.offset + p.count; ++i) ++seen[i];
        sum += p.count;
      }
      EXPECT_EQ(sum, s.numel());
      EXPECT_TRUE(s.begin >= 0 && s.end <= B);
      total += sum;
    }
    EXPECT_EQ(total, v - u);
    for (int64_t i = 0; i < N; ++i) ASSERT_EQ(seen[i], (i >= u && i < v) ? 1 : 0) << "flat " << i;
  }
  // The whole buffer: one whole block per expert, its pieces in layout order (w13 then w2 of each layer).
  const auto whole = expert_segments(L, 0, nullptr, 0, 0, N);
  ASSERT_EQ(whole.size(), 2u);
  EXPECT_EQ(whole[0].name(), "expert.2.master");
  EXPECT_EQ(whole[1].pieces[0].offset, L.find("model.layers.0.block_sparse_moe.experts.w13").numel / 2);
}

// ---- ranks as threads --------------------------------------------------------------------------------------

struct Hub {
  explicit Hub(int n) : n(n), slots(static_cast<size_t>(n)) {}
  int n;
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  int64_t gen = 0;
  std::vector<std::string> slots;
  void barrier() {
    std::unique_lock<std::mutex> l(mu);
    const int64_t g = gen;
    if (++arrived == n) {
      arrived = 0;
      ++gen;
      cv.notify_all();
    } else {
      cv.wait(l, [&] { return gen != g; });
    }
  }
};

class ThreadComm : public CkptComm {
 public:
  ThreadComm(Hub& h, int r) : h_(h), r_(r) {}
  int rank() const override { return r_; }
  int size() const override { return h_.n; }
  void barrier() override { h_.barrier(); }
  std::vector<std::string> gather(const std::string& mine) override {
    put(r_, mine);
    h_.barrier();
    std::vector<std::string> out;
    if (r_ == 0) {
      std::lock_guard<std::mutex> l(h_.mu);
      out = h_.slots;
    }
    h_.barrier();
    return out;
  }
  std::string broadcast(const std::string& s) override {
    if (r_ == 0) put(0, s);
    h_.barrier();
    std::string v;
    {
      std::lock_guard<std::mutex> l(h_.mu);
      v = h_.slots[0];
    }
    h_.barrier();
    return v;
  }
  bool all_true(bool b) override {
    put(r_, b ? "1" : "0");
    h_.barrier();
    bool all = true;
    {
      std::lock_guard<std::mutex> l(h_.mu);
      for (const auto& s : h_.slots) all = all && s == "1";
    }
    h_.barrier();
    return all;
  }

 private:
  void put(int i, const std::string& s) {
    std::lock_guard<std::mutex> l(h_.mu);
    h_.slots[static_cast<size_t>(i)] = s;
  }
  Hub& h_;
  int r_;
};

// The whole model's state in layout-free terms: dense buffers and each expert's block, per role.
struct GlobalState {
  std::vector<float> dense[3];
  std::vector<std::vector<float>> block[3];  // [role][expert]
};

GlobalState random_global(const ModelConfig& m, uint64_t seed) {
  const ParamLayout L = ParamLayout::build(m, 0, m.num_local_experts);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd;
  GlobalState g;
  for (int k = 0; k < 3; ++k) {
    g.dense[k].resize(static_cast<size_t>(L.dense_numel));
    for (auto& x : g.dense[k]) x = nd(rng);
    g.block[k].resize(static_cast<size_t>(m.num_local_experts));
    for (auto& b : g.block[k]) {
      b.resize(static_cast<size_t>(expert_block_numel(L)));
      for (auto& x : b) x = nd(rng);
    }
  }
  return g;
}

// One rank of a dp x ep job as the distributed trainer lays it out: world rank w = dp_rank * ep + ep_rank,
// experts [ep_rank * E/ep, ...), ZeRO-1 moments over the world (dense) and the dp group (experts), buffers
// padded to a multiple of the group.
struct Rank {
  int w = 0, world = 1, dp = 1, ep = 1;
  ParamLayout layout;
  std::vector<float> dbuf[3], ebuf[3];
  FlatParams dense, expert;
  TrainState::Moments dm, em;
  int64_t step = 0;
  std::unique_ptr<BatchLoader> loader;

  Rank(const ModelConfig& m, const DatasetConfig& dc, int w_, int dp_, int ep_) : w(w_), world(dp_ * ep_), dp(dp_), ep(ep_) {
    const int64_t n = m.num_local_experts / ep;
    const int ep_rank = w % ep, dp_rank = w / ep;
    layout = ParamLayout::build(m, ep_rank * n, n);
    auto shard = [](int64_t numel, int group, int idx, TrainState::Moments& mo) {
      const int64_t padded = (numel + group - 1) / group * group;
      if (group > 1) mo = {idx * (padded / group), padded / group};
      return std::make_pair(padded, group > 1 ? padded / group : padded);
    };
    const auto [dpad, dsh] = shard(layout.dense_numel, world, w, dm);
    const auto [epad, esh] = shard(layout.expert_numel, dp, dp_rank, em);
    dm.master_too = world > 1;  // as the trainer: over several ranks the dense master is sharded too
    for (int k = 0; k < 3; ++k) {
      dbuf[k].assign(static_cast<size_t>(k == 0 && !dm.master_too ? dpad : dsh), 0.f);
      ebuf[k].assign(static_cast<size_t>(k == 0 ? epad : esh), 0.f);
    }
    bind(dense, dbuf);
    bind(expert, ebuf);
    loader = std::make_unique<BatchLoader>(embedded_corpus_tokens(), dc, 42, w, world);
  }
  static void bind(FlatParams& f, std::vector<float>* b) {
    f.master = Tensor(b[0].data(), DType::F32, {static_cast<int64_t>(b[0].size())});
    f.adam_m = Tensor(b[1].data(), DType::F32, {static_cast<int64_t>(b[1].size())});
    f.adam_v = Tensor(b[2].data(), DType::F32, {static_cast<int64_t>(b[2].size())});
  }
  TrainState state(Ops& ops) {
    TrainState s{ops, layout, dense, expert, step, *loader, world};
    s.expert_replica = w / ep;
    s.expert_replicas = dp;
    s.dense_moments = dm;
    s.expert_moments = em;
    return s;
  }
  // What this rank's buffers hold for a global state (padding 0); the layout math written independently
  // of the checkpoint code: local expert element (p, j, i) is global expert first+j's block element
  // in_block(p) + i.
  void expected(const GlobalState& g, std::vector<float>* dexp, std::vector<float>* eexp) const {
    const int64_t n = layout.num_local_experts;
    for (int k = 0; k < 3; ++k) {
      std::vector<float> eflat(static_cast<size_t>(layout.expert_numel));
      int64_t in_block = 0;
      for (const ParamInfo& p : layout.params) {
        if (!p.expert) continue;
        const int64_t per = p.numel / n;
        for (int64_t j = 0; j < n; ++j)
          for (int64_t i = 0; i < per; ++i)
            eflat[p.offset + j * per + i] = g.block[k][layout.first_expert + j][in_block + i];
        in_block += per;
      }
      auto fill = [](const std::vector<float>& flat, const TrainState::Moments& mo, int role, std::vector<float>& out,
                     size_t size) {
        out.assign(size, 0.f);
        const int64_t shift = (role == 0 && !mo.master_too) || mo.count < 0 ? 0 : mo.offset;
        for (size_t i = 0; i < size; ++i)
          if (shift + static_cast<int64_t>(i) < static_cast<int64_t>(flat.size())) out[i] = flat[shift + i];
      };
      fill(g.dense[k], dm, k, dexp[k], dbuf[k].size());
      fill(eflat, em, k, eexp[k], ebuf[k].size());
    }
  }
};

TrainConfig ckpt_config(const std::string& dir) {
  TrainConfig c;
  c.model = tiny_model();
  c.dataset.micro_batch_size = 2;
  c.dataset.max_seq_length = 32;
  c.checkpoint.ckpt_dir = dir;
  c.checkpoint.max_checkpoints = 0;
  return c;
}

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("mxtrain_ckpt_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// Save a global state from a dp x ep job (threads), return the checkpoint directory.
std::string save_from(const GlobalState& g, int dp, int ep, const std::string& root, int64_t step, Ops& ops) {
  TrainConfig c = ckpt_config(root);
  c.parallelism.dp_size = dp;
  c.parallelism.ep_size = ep;
  const int W = dp * ep;
  std::vector<std::unique_ptr<Rank>> ranks;
  for (int w = 0; w < W; ++w) {
    ranks.push_back(std::make_unique<Rank>(c.model, c.dataset, w, dp, ep));
    std::vector<float> d[3], e[3];
    ranks[w]->expected(g, d, e);
    for (int k = 0; k < 3; ++k) {
      ranks[w]->dbuf[k] = d[k];
      ranks[w]->ebuf[k] = e[k];
    }
    Rank::bind(ranks[w]->dense, ranks[w]->dbuf);
    Rank::bind(ranks[w]->expert, ranks[w]->ebuf);
    ranks[w]->step = step;
  }
  Hub hub(W);
  std::vector<std::thread> th;
  std::vector<std::string> err(static_cast<size_t>(W));
  for (int w = 0; w < W; ++w)
    th.emplace_back([&, w] {
      try {
        ThreadComm comm(hub, w);
        save_checkpoint(c, ranks[w]->state(ops), comm);
      } catch (const std::exception& e) {
        err[w] = e.what();
      }
    });
  for (auto& t : th) t.join();
  for (int w = 0; w < W; ++w) EXPECT_EQ(err[w], "") << "rank " << w;
  return root + "/step_" + std::to_string(step);
}

TEST(CheckpointReshard, EveryLayoutLoadsEveryOtherBitForBit) {
  auto ops = make_cpu_ops();
  const ModelConfig m = tiny_model();
  const GlobalState g = random_global(m, 11);
  // (dp, ep); dp 5 pads the ZeRO-1 buffers (their sizes are not multiples of 5).
  const std::pair<int, int> layouts[] = {{1, 1}, {1, 2}, {2, 1}, {2, 2}, {1, 4}, {5, 1}};
  {
    const Rank r(m, ckpt_config("x").dataset, 4, 5, 1);
    // the last rank's dense master shard runs into the padding
    ASSERT_GT(r.dm.offset + static_cast<int64_t>(r.dbuf[0].size()), r.layout.dense_numel);
    ASSERT_GT(r.ebuf[0].size(), static_cast<size_t>(r.layout.expert_numel));
  }
  for (const auto& [sdp, sep] : layouts) {
    const fs::path root = fresh_dir("reshard_" + std::to_string(sdp) + "x" + std::to_string(sep));
    const std::string dir = save_from(g, sdp, sep, root.string(), 7, *ops);
    ASSERT_TRUE(fs::exists(dir + "/manifest.json"));
    for (const auto& [ldp, lep] : layouts) {
      TrainConfig c = ckpt_config(root.string());
      for (int w = 0; w < ldp * lep; ++w) {
        Rank r(m, c.dataset, w, ldp, lep);
        for (int k = 0; k < 3; ++k) {  // poison: a value that was not loaded shows
          std::fill(r.dbuf[k].begin(), r.dbuf[k].end(), -777.f);
          std::fill(r.ebuf[k].begin(), r.ebuf[k].end(), -777.f);
        }
        load_checkpoint(dir, c, r.state(*ops));
        std::vector<float> d[3], e[3];
        r.expected(g, d, e);
        const std::string where = "saved dp" + std::to_string(sdp) + " ep" + std::to_string(sep) + ", loaded dp" +
                                  std::to_string(ldp) + " ep" + std::to_string(lep) + " rank " + std::to_string(w);
        EXPECT_EQ(r.step, 7) << where;
        for (int k = 0; k < 3; ++k) {
          // Padding past numel is never loaded; compare the real elements.
          const size_t dn = std::min(d[k].size(), static_cast<size_t>(std::max<int64_t>(0, r.layout.dense_numel - ((k || r.dm.master_too) && r.dm.count >= 0 ? r.dm.offset : 0))));
          const size_t en = std::min(e[k].size(), static_cast<size_t>(std::max<int64_t>(0, r.layout.expert_numel - (k && r.em.count >= 0 ? r.em.offset : 0))));
          ASSERT_EQ(0, std::memcmp(r.dbuf[k].data(), d[k].data(), dn * 4)) << where << " dense " << role_name(k);
          ASSERT_EQ(0, std::memcmp(r.ebuf[k].data(), e[k].data(), en * 4)) << where << " expert " << role_name(k);
        }
      }
    }
  }
}

// Masters held split (optimizer_store_param_remainders: a bf16 working copy + an I16 remainder per element, on one
// rank): a checkpoint saved from whole fp32 masters loads into split ones that join back to the same bits, and
// saving from the split ones writes those bits again (the file holds fp32 either way).
TEST(CheckpointReshard, SplitMastersSaveAndLoadTheFp32Bits) {
  auto ops = make_cpu_ops();
  const ModelConfig m = tiny_model();
  const GlobalState g = random_global(m, 23);
  const fs::path root = fresh_dir("split_master");
  const std::string dir = save_from(g, 1, 1, root.string(), 5, *ops);
  TrainConfig c = ckpt_config(root.string());
  Rank r(m, c.dataset, 0, 1, 1);
  std::vector<uint16_t> hi[2];
  std::vector<int16_t> rem[2];
  FlatParams* roles[2] = {&r.dense, &r.expert};
  for (int k = 0; k < 2; ++k) {
    const int64_t n = static_cast<int64_t>((k ? r.ebuf : r.dbuf)[0].size());
    hi[k].assign(static_cast<size_t>(n), 0x7777);
    rem[k].assign(static_cast<size_t>(n), 0x1234);
    roles[k]->master = Tensor();
    roles[k]->working = Tensor(hi[k].data(), DType::BF16, {n});
    roles[k]->rem = Tensor(rem[k].data(), DType::I16, {n});
    ASSERT_TRUE(roles[k]->split());
  }
  load_checkpoint(dir, c, r.state(*ops));
  std::vector<float> d[3], e[3];
  r.expected(g, d, e);
  for (int k = 0; k < 2; ++k) {
    const std::vector<float>& want = k ? e[0] : d[0];
    int64_t differ = 0, not_nearest = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      const float got = join_master(hi[k][i], rem[k][i]);
      differ += std::memcmp(&got, &want[i], 4) != 0;
      uint32_t u;
      std::memcpy(&u, &want[i], 4);
      if ((u & 0xffffu) != 0x8000u) not_nearest += bf16_bits_to_f32(hi[k][i]) != round_to_bf16(want[i]);
    }
    EXPECT_EQ(differ, 0) << (k ? "expert" : "dense");
    EXPECT_EQ(not_nearest, 0) << "the working copy is the nearest bf16 but on exact ties";
  }
  const fs::path root2 = fresh_dir("split_master_resave");
  TrainConfig c2 = ckpt_config(root2.string());
  r.step = 6;
  {
    Hub hub(1);
    ThreadComm comm(hub, 0);
    save_checkpoint(c2, r.state(*ops), comm);
  }
  Rank back(m, c2.dataset, 0, 1, 1);
  load_checkpoint(root2.string() + "/step_6", c2, back.state(*ops));
  EXPECT_EQ(0, std::memcmp(back.dbuf[0].data(), d[0].data(), d[0].size() * 4));
  EXPECT_EQ(0, std::memcmp(back.ebuf[0].data(), e[0].data(), e[0].size() * 4));
}

// split_master / join_master: every fp32 bit pattern class comes back exactly (normals, subnormals, zeros of both
// signs, the largest finite, infinities), the upper half is the nearest bf16 but on an exact tie, where it rounds
// away from zero, and the remainder is the lower half.
TEST(SplitMaster, JoinsBackEveryBitAndRoundsTiesAway) {
  std::mt19937 rng(5);
  std::vector<uint32_t> bits = {0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x7f7fffffu, 0xff7fffffu,
                                0x7f800000u, 0xff800000u, 0x3f808000u, 0x3f818000u, 0xbf808000u, 0x3f807fffu};
  for (int i = 0; i < 100000; ++i) bits.push_back(rng());
  int64_t ties = 0;
  for (const uint32_t u : bits) {
    float f;
    std::memcpy(&f, &u, 4);
    if (std::isnan(f)) continue;
    uint16_t hi;
    int16_t rem;
    split_master(f, hi, rem);
    const float back = join_master(hi, rem);
    ASSERT_EQ(0, std::memcmp(&back, &f, 4)) << std::hex << u;
    ASSERT_EQ(static_cast<uint16_t>(rem), u & 0xffffu);
    if ((u & 0xffffu) == 0x8000u) {
      ++ties;
      EXPECT_EQ(hi, static_cast<uint16_t>((u >> 16) + 1)) << std::hex << u;
    } else if (!std::isinf(f) && std::fabs(f) < 3.38e38f) {
      EXPECT_EQ(hi, f32_to_bf16_bits(f)) << std::hex << u;
    }
  }
  EXPECT_GE(ties, 3);
}

TEST(CheckpointReshard, ManifestRecordsLayoutAndExpertsByGlobalIndex) {
  auto ops = make_cpu_ops();
  const fs::path root = fresh_dir("manifest_layout");
  const std::string dir = save_from(random_global(tiny_model(), 5), 1, 2, root.string(), 3, *ops);
  const Manifest m = read_manifest(dir);
  EXPECT_EQ(m.world_size, 2);
  EXPECT_EQ(m.ep_size, 2);
  ASSERT_EQ(m.shards.size(), 2u);
  // Rank 1 holds experts 2 and 3 and writes them under their global names.
  bool saw = false;
  for (const auto& t : m.shards[1].tensors) saw = saw || t.key == "expert.3.adam_v";
  EXPECT_TRUE(saw);
  for (const auto& t : m.shards[1].tensors) EXPECT_EQ(t.key.find("expert.0."), std::string::npos) << t.key;
}

TEST(CheckpointManifest, TilingGapsAndOverlapsAreNamed) {
  auto ops = make_cpu_ops();
  const fs::path root = fresh_dir("tiling");
  const std::string dir = save_from(random_global(tiny_model(), 5), 1, 2, root.string(), 3, *ops);
  Manifest m = read_manifest(dir);
  EXPECT_NO_THROW(check_tiling(m, "x"));
  Manifest gap = m;
  gap.shards[1].tensors.erase(gap.shards[1].tensors.begin() + 1);  // a dense part of rank 1
  try {
    check_tiling(gap, "x");
    FAIL() << "no error";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("dense.adam_m"), std::string::npos) << e.what();
  }
  Manifest dup = m;
  dup.shards[1].tensors.push_back(dup.shards[0].tensors.back());
  EXPECT_THROW(check_tiling(dup, "x"), CheckpointError);
}

// The manifest names the binary that wrote it (version and source commit), inside the checksummed body.
TEST(CheckpointManifest, NamesTheWritingBinary) {
  auto ops = make_cpu_ops();
  const fs::path root = fresh_dir("manifest_writer");
  const std::string dir = save_from(random_global(tiny_model(), 5), 1, 1, root.string(), 3, *ops);
  std::ifstream in(dir + "/manifest.json");
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  const std::string line = "\"written_by\": \"mxtrain " + version_string() + "\"";
  EXPECT_NE(text.find(line), std::string::npos) << text.substr(0, 300);
  EXPECT_NO_THROW(read_manifest(dir));
}

TEST(CheckpointManifest, DamagedManifestIsDetected) {
  auto ops = make_cpu_ops();
  const fs::path root = fresh_dir("manifest_damage");
  const std::string dir = save_from(random_global(tiny_model(), 5), 1, 1, root.string(), 3, *ops);
  const std::string path = dir + "/manifest.json";
  std::string text;
  {
    std::ifstream in(path);
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  const size_t at = text.find("\"step\": 3");
  ASSERT_NE(at, std::string::npos);
  text[at + 8] = '4';  // still valid JSON: only the checksum can tell
  {
    std::ofstream out(path);
    out << text;
  }
  try {
    read_manifest(dir);
    FAIL() << "no error";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("manifest.json: checksum mismatch"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mxt
