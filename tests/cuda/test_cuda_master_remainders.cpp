// optimizer_store_param_remainders: the fp32 master held as the bf16 working copy + a 16-bit remainder
// (mxtrain/bf16.hpp's split_master). The split AdamW step against the whole-master step on the same values, bit for
// bit; the trainer with split masters beside whole ones, and its checkpoint resume. Skips without a GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "cuda_test_util.hpp"
#include "tiny_config.hpp"
#include "trained_run.hpp"
#include "mxtrain/bf16.hpp"
#include "mxtrain/data.hpp"
#include "mxtrain/params.hpp"
#include "mxtrain/trainer.hpp"

namespace mxt::testing {
namespace {

template <typename T>
DeviceTensor upload_bits(Ops& gpu, const std::vector<T>& bits, DType dtype) {
  DeviceTensor d(gpu, dtype, {static_cast<int64_t>(bits.size())});
  gpu.upload(d.t.data, bits.data(), bits.size() * sizeof(T));
  return d;
}

template <typename T>
std::vector<T> download_bits(Ops& gpu, const Tensor& t) {
  std::vector<T> out(static_cast<size_t>(t.numel()));
  gpu.download(out.data(), t.data, out.size() * sizeof(T));
  return out;
}

// The split step joins, updates and splits exactly as the whole-master step updates: the joined result is its
// fp32 master bit for bit, the upper halves are that master's split (its working copy but on exact ties), the
// moments are its moments; the vector path, the scalar path (a buffer misaligned by one element), F32 and BF16
// grads and moments.
TEST(CudaMasterRemainders, StepIsTheWholeMasterStep) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  AdamWStep s;
  s.lr = 1e-3f;
  s.weight_decay = 0.1f;
  s.step = 3;
  s.grad_scale = 0.9f;
  for (const int64_t n : {int64_t{1000003}, int64_t{6}}) {
    for (const int64_t offset : {int64_t{0}, int64_t{1}}) {
      for (const DType st : {DType::F32, DType::BF16}) {
        SCOPED_TRACE("n " + std::to_string(n) + " offset " + std::to_string(offset) + " grads and moments " +
                     dtype_name(st));
        std::vector<float> p = randn(n + offset, 11, 0.05f), g = randn(n + offset, 12), m = randn(n + offset, 13, 0.1f);
        std::vector<float> v = randn(n + offset, 14, 0.1f);
        for (float& x : v) x = x * x;
        if (st == DType::BF16) {
          round_bf16(g);
          round_bf16(m);
          round_bf16(v);
        }
        std::vector<uint16_t> hi(p.size());
        std::vector<int16_t> rem(p.size());
        for (size_t i = 0; i < p.size(); ++i) split_master(p[i], hi[i], rem[i]);
        auto view = [&](const DeviceTensor& d) { return d.t.rows(offset, n); };
        auto P = upload(*gpu, p, DType::F32, {n + offset}), W = upload(*gpu, p, DType::BF16, {n + offset});
        auto G1 = upload(*gpu, g, st, {n + offset}), M1 = upload(*gpu, m, st, {n + offset});
        auto V1 = upload(*gpu, v, st, {n + offset});
        gpu->adamw_step_to(view(P), view(G1), view(M1), view(V1), s, view(W));
        auto H = upload_bits(*gpu, hi, DType::BF16), R = upload_bits(*gpu, rem, DType::I16);
        auto G2 = upload(*gpu, g, st, {n + offset}), M2 = upload(*gpu, m, st, {n + offset});
        auto V2 = upload(*gpu, v, st, {n + offset});
        gpu->adamw_step_split(view(H), view(R), view(G2), view(M2), view(V2), s);
        const std::vector<float> want = download(*gpu, P.t);
        const std::vector<uint16_t> got_hi = download_bits<uint16_t>(*gpu, H.t);
        const std::vector<int16_t> got_rem = download_bits<int16_t>(*gpu, R.t);
        int64_t differ = 0, hi_differ = 0, moved = 0;
        for (int64_t i = offset; i < n + offset; ++i) {
          const float joined = join_master(got_hi[i], got_rem[i]);
          differ += std::memcmp(&joined, &want[i], 4) != 0;
          uint16_t h;
          int16_t r;
          split_master(want[i], h, r);
          hi_differ += h != got_hi[i];
          moved += want[i] != p[i];
        }
        EXPECT_EQ(differ, 0);
        EXPECT_EQ(hi_differ, 0);
        EXPECT_GT(moved, n / 2);
        if (offset) EXPECT_EQ(got_hi[0], hi[0]) << "the element before the view is untouched";
        EXPECT_EQ(download(*gpu, M2.t), download(*gpu, M1.t));
        EXPECT_EQ(download(*gpu, V2.t), download(*gpu, V1.t));
      }
    }
  }
  // Wrong dtypes are refused.
  DeviceTensor a(*gpu, DType::F32, {8}), b(*gpu, DType::BF16, {8});
  EXPECT_THROW(gpu->adamw_step_split(a.t, b.t, a.t, a.t, a.t, s), std::exception);
}

TrainConfig remainder_config(const std::string& name, bool split) {
  TrainConfig c = tiny_config("mxtrain_test_cuda_remainders_" + name, 64, 128);
  c.num_train_steps = 6;
  c.lr_scheduler = {2, 4, 0.1};
  c.optimizer_store_param_remainders = split;
  return c;
}


// The trainer with split masters is the trainer with whole ones wherever no master sits on an exact bf16 tie: from
// an initialisation without ties (a seed searched for), the first step's masters are bit for bit the same. Later
// steps' working copies differ on the rare ties (one bf16 step), which the learned router can turn into another
// expert for a token: over 6 steps the losses agree to 1e-4 and the masters to the measured spread (session 58, H100:
// rel L2 dense 2.0e-4, experts 6.7e-3; with fixed routing 1.3e-4 / 6.4e-4), bounded here at about 5x. Both roles
// are held split (one rank, bf16). A resume from a checkpoint of split masters continues bit for bit.
TEST(CudaMasterRemainders, TrainingFollowsWholeMastersAndResumesExactly) {
  MXT_REQUIRE_GPU();
  auto gpu = make_cuda_ops();
  {
    TrainConfig w1 = remainder_config("whole_1", false), s1 = remainder_config("split_1", true);
    w1.num_train_steps = s1.num_train_steps = 1;
    // The schedule's first step has lr 0 under warm-up (session 59, H200: the weights did not move), so no warm-up.
    w1.lr_scheduler = s1.lr_scheduler = {0, 4, 0.1};
    const ParamLayout layout = ParamLayout::build(w1.model, 0, w1.model.num_local_experts);
    std::vector<float> dense(static_cast<size_t>(layout.dense_numel)), expert(static_cast<size_t>(layout.expert_numel));
    auto has_tie = [](const std::vector<float>& v) {
      for (float f : v) {
        uint32_t u;
        std::memcpy(&u, &f, 4);
        if ((u & 0xffffu) == 0x8000u) return true;
      }
      return false;
    };
    uint64_t seed = 1;
    for (; seed < 5000; ++seed) {
      init_params_host(layout, w1.model, seed, dense, expert);
      if (!has_tie(dense) && !has_tie(expert)) break;
    }
    ASSERT_LT(seed, 5000u) << "no seed without ties";
    w1.seed = s1.seed = seed;
    const TrainedRun a = train_to_end(w1, *gpu), b = train_to_end(s1, *gpu);
    EXPECT_EQ(a.losses, b.losses) << "seed " << seed;
    EXPECT_EQ(a.dense, b.dense) << "seed " << seed;
    EXPECT_EQ(a.expert, b.expert) << "seed " << seed;
    EXPECT_NE(a.dense, std::vector<float>(dense.begin(), dense.end())) << "the step moved the weights";
  }
  const TrainedRun whole = train_to_end(remainder_config("whole", false), *gpu);
  const TrainConfig sc = remainder_config("split", true);
  {
    Trainer t(sc, *gpu, embedded_corpus_tokens());
    EXPECT_TRUE(t.dense().split());
    EXPECT_TRUE(t.expert().split());
    EXPECT_EQ(t.dense().master.data, nullptr);
  }
  const TrainedRun split = train_to_end(sc, *gpu);
  ASSERT_EQ(split.losses.size(), whole.losses.size());
  for (size_t i = 0; i < whole.losses.size(); ++i)
    EXPECT_NEAR(split.losses[i], whole.losses[i], 1e-4 * std::abs(whole.losses[i])) << "step " << i + 1;
  EXPECT_LT(rel_l2(split.dense, whole.dense), 1e-3);
  EXPECT_LT(rel_l2(split.expert, whole.expert), 3e-2);
  EXPECT_LT(whole.losses.back(), whole.losses.front());
  {
    TrainConfig fw = remainder_config("whole_fixed", false), fs = remainder_config("split_fixed", true);
    fw.model.router_force_load_balancing = fs.model.router_force_load_balancing = true;
    const TrainedRun a = train_to_end(fw, *gpu), b = train_to_end(fs, *gpu);
    std::printf("[remainders] masters' rel L2, split against whole: learned router dense %.3g expert %.3g; fixed "
                "routing dense %.3g expert %.3g\n",
                rel_l2(split.dense, whole.dense), rel_l2(split.expert, whole.expert), rel_l2(b.dense, a.dense),
                rel_l2(b.expert, a.expert));
    EXPECT_LT(rel_l2(b.dense, a.dense), 1e-3);
    EXPECT_LT(rel_l2(b.expert, a.expert), 3e-3);
    EXPECT_GT(rel_l2(a.expert, whole.expert), 1e-4) << "the fixed routing is another run";
  }

  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / "mxtrain_test_cuda_remainders_ckpt";
  fs::remove_all(root);
  TrainConfig half = sc;
  half.num_train_steps = 3;
  half.checkpoint.ckpt_dir = root.string();
  half.checkpoint.save_every_n_steps = 3;
  half.checkpoint.max_checkpoints = 0;
  half.checkpoint.save_final_model = false;
  std::vector<double> losses = train_to_end(half, *gpu).losses;
  TrainConfig rest = half;
  rest.num_train_steps = 6;
  rest.checkpoint.save_every_n_steps = 0;
  rest.checkpoint.resume_from_checkpoint = true;
  const TrainedRun second = train_to_end(rest, *gpu);
  losses.insert(losses.end(), second.losses.begin(), second.losses.end());
  ASSERT_EQ(losses.size(), split.losses.size());
  for (size_t i = 0; i < losses.size(); ++i) EXPECT_EQ(losses[i], split.losses[i]) << "step " << i + 1;
  EXPECT_EQ(second.dense, split.dense);
  EXPECT_EQ(second.expert, split.expert);
  fs::remove_all(root);
}

}  // namespace
}  // namespace mxt::testing
