// Checkpoints through the Trainer on the CPU backend, one rank: exact resume (bit-identical losses and
// weights, sync and async, across an epoch boundary), retention, and every documented error: missing,
// truncated or corrupt shard, damaged manifest, incompatible model shape, full disk; a corrupt newest
// checkpoint falls back to the previous one and says so.
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "ckpt/ckpt_internal.hpp"
#include "mxtrain/bf16.hpp"
#include "tiny_config.hpp"
#include "mxtrain/checkpoint.hpp"
#include "mxtrain/data.hpp"
#include "mxtrain/trainer.hpp"

namespace mxt {
namespace {

namespace fs = std::filesystem;

TrainConfig tiny(const std::string& name) {
  TrainConfig c = testing::tiny_config("unused");
  c.model.router_jitter_noise = 0.05;  // the jitter stream must continue across a resume
  c.model.router_aux_loss_coef = 0.01;
  c.num_train_steps = TrainConfig{}.num_train_steps;
  c.lr_scheduler = {2, 10, 0.1};
  c.logger.frequency = 1;
  const fs::path root = fs::temp_directory_path() / ("mxtrain_ckpt_trainer_" + name);
  fs::remove_all(root);
  c.output_dir = (root / "out").string();
  c.checkpoint.ckpt_dir = (root / "ckpt").string();
  c.checkpoint.save_every_n_steps = 2;
  c.checkpoint.max_checkpoints = 0;
  c.checkpoint.save_final_model = false;
  c.checkpoint.resume_from_checkpoint = true;
  return c;
}

// A short corpus: 13 windows of 32 tokens with stride 8, so 6 steps of 2 x 2 rows cross epochs.
std::vector<int32_t> short_corpus() {
  std::vector<int32_t> t = embedded_corpus_tokens();
  t.resize(32 + 12 * 24);
  return t;
}

std::vector<float> weights(Trainer& t) {
  std::vector<float> d, e;
  t.master_weights(d, e);
  d.insert(d.end(), e.begin(), e.end());
  for (FlatParams* f : {&t.dense(), &t.expert()})
    for (const Tensor* m : {&f->adam_m, &f->adam_v}) {
      if (m->dtype == DType::F32) {
        d.insert(d.end(), m->f32(), m->f32() + m->numel());
        continue;
      }
      const auto* b = static_cast<const uint16_t*>(m->data);  // adamw_moments_dtype=bfloat16
      for (int64_t i = 0; i < m->numel(); ++i) d.push_back(bf16_bits_to_f32(b[i]));
    }
  return d;
}

std::vector<double> run(const TrainConfig& c, std::vector<float>* w = nullptr) {
  auto ops = make_cpu_ops();
  Trainer t(c, *ops, short_corpus());
  std::vector<double> l = t.run();
  if (w) *w = weights(t);
  return l;
}

// Collects spdlog output while alive.
struct LogCapture {
  std::ostringstream out;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out);
  LogCapture() { spdlog::default_logger()->sinks().push_back(sink); }
  ~LogCapture() {
    auto& s = spdlog::default_logger()->sinks();
    s.erase(std::remove(s.begin(), s.end(), sink), s.end());
  }
  std::string text() { return out.str(); }
};

void expect_resume_exact(const std::string& name, int64_t n, const std::string& moments = "float32") {
  TrainConfig c = tiny(name + "_straight");
  c.adamw_moments_dtype = moments;
  c.num_train_steps = n;
  c.checkpoint.ckpt_dir.clear();
  std::vector<float> w_straight, w_resumed;
  const std::vector<double> straight = run(c, &w_straight);
  ASSERT_EQ(straight.size(), static_cast<size_t>(n));

  c = tiny(name);
  c.adamw_moments_dtype = moments;
  TrainConfig half = c;
  half.num_train_steps = n / 2;
  half.checkpoint.save_every_n_steps = n / 2;
  std::vector<double> losses = run(half);
  TrainConfig rest = c;
  rest.num_train_steps = n;
  rest.checkpoint.save_every_n_steps = 0;
  const std::vector<double> second = run(rest, &w_resumed);
  losses.insert(losses.end(), second.begin(), second.end());
  ASSERT_EQ(losses.size(), straight.size());
  for (size_t i = 0; i < losses.size(); ++i) EXPECT_EQ(losses[i], straight[i]) << "step " << i + 1;  // bit for bit
  ASSERT_EQ(w_resumed.size(), w_straight.size());
  EXPECT_EQ(0, std::memcmp(w_resumed.data(), w_straight.data(), w_straight.size() * 4)) << "weights / moments";
}

TEST(CheckpointTrainer, ResumeIsBitExact) { expect_resume_exact("exact", 12); }

// optimizer_store_param_remainders: the memory plan holds an unsharded master in 2 bytes (its remainder; the
// working copy is its upper half) instead of 4, and a backend that computes in fp32 (the CPU) is a config error
// naming the key. The split masters' training and resume run on the GPU (CudaMasterRemainders).
TEST(CheckpointTrainer, SplitMastersHalveTheMasterBytesAndNeedTheCudaBackend) {
  TrainConfig whole = tiny("split_plan"), split = whole;
  split.optimizer_store_param_remainders = true;
  const MemoryPlan pw = plan_memory(whole, DType::BF16), ps = plan_memory(split, DType::BF16);
  EXPECT_EQ(pw.param_bytes - ps.param_bytes, static_cast<size_t>(pw.dense_params + pw.expert_params) * 2);
  EXPECT_EQ(plan_memory(whole, DType::F32).param_bytes, plan_memory(split, DType::F32).param_bytes);
  auto ops = make_cpu_ops();
  try {
    Trainer t(split, *ops, short_corpus());
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer_store_param_remainders=true needs the CUDA bf16 backend"),
              std::string::npos)
        << e.what();
  }
}

// adamw_moments_dtype=bfloat16: the checkpoint stores the moments in fp32, which holds their bf16 values exactly, so
// the resume is bit-exact too.
TEST(CheckpointTrainer, Bf16MomentsResumeBitExact) { expect_resume_exact("bf16_moments", 8, "bfloat16"); }

// Either moments dtype resumes the other's checkpoint (fp32 moments rounded to bf16, or bf16 widened), and training
// then follows the uninterrupted run of the checkpoint's setting closely; the moments are held in the dtype asked.
TEST(CheckpointTrainer, MomentsDtypeMayChangeAtAResume) {
  for (const auto& [saved, resumed] : {std::pair<std::string, std::string>{"float32", "bfloat16"}, {"bfloat16", "float32"}}) {
    TrainConfig c = tiny("moments_" + saved);
    c.adamw_moments_dtype = saved;
    c.num_train_steps = 8;
    c.checkpoint.ckpt_dir.clear();
    const std::vector<double> straight = run(c);
    c = tiny("moments_" + saved);
    c.adamw_moments_dtype = saved;
    c.num_train_steps = 4;
    c.checkpoint.save_every_n_steps = 4;
    run(c);
    c.adamw_moments_dtype = resumed;
    c.num_train_steps = 8;
    c.checkpoint.save_every_n_steps = 0;
    auto ops = make_cpu_ops();
    Trainer t(c, *ops, short_corpus());
    EXPECT_EQ(t.dense().adam_m.dtype, resumed == "bfloat16" ? DType::BF16 : DType::F32);
    EXPECT_EQ(t.expert().adam_v.dtype, resumed == "bfloat16" ? DType::BF16 : DType::F32);
    const std::vector<double> second = t.run();
    ASSERT_EQ(second.size(), 4u) << saved << " -> " << resumed;
    for (size_t i = 0; i < second.size(); ++i)
      EXPECT_NEAR(second[i], straight[4 + i], 2e-3 * straight[4 + i]) << saved << " -> " << resumed << " step " << i + 5;
  }
}

TEST(CheckpointTrainer, AsyncSaveResumesBitExactToo) {
  TrainConfig c = tiny("async");
  c.num_train_steps = 8;
  c.checkpoint.async_save = true;
  c.checkpoint.save_every_n_steps = 1;
  const std::vector<double> a = run(c);  // saves every step in the background
  const auto found = find_checkpoints(c.checkpoint.ckpt_dir);
  ASSERT_EQ(found.size(), 8u);
  // Resume from step 4 of the async run and compare with its own later losses.
  for (const auto& [step, dir] : found)
    if (step > 4) fs::remove_all(dir);
  TrainConfig rest = c;
  rest.checkpoint.async_save = false;
  rest.checkpoint.save_every_n_steps = 0;
  const std::vector<double> b = run(rest);
  ASSERT_EQ(b.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(b[i], a[4 + i]) << "step " << 5 + i;
}

TEST(CheckpointTrainer, MetricsFileHoldsEveryStepOnceAfterResume) {
  TrainConfig c = tiny("metrics");
  c.num_train_steps = 5;  // saves at 2 and 4, logs 1..5
  run(c);
  // Pretend the run died after logging step 5 but before a save: resume from 4 re-logs 5.
  c.num_train_steps = 7;
  run(c);
  std::ifstream in(c.output_dir + "/metrics.jsonl");
  std::vector<int64_t> steps;
  for (std::string line; std::getline(in, line);) steps.push_back(nlohmann::json::parse(line)["step"].get<int64_t>());
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7}));
}

TEST(CheckpointTrainer, RetentionKeepsTheNewestAndLeavesNoTemporaries) {
  TrainConfig c = tiny("retention");
  c.num_train_steps = 5;
  c.checkpoint.save_every_n_steps = 1;
  c.checkpoint.max_checkpoints = 2;
  run(c);
  const auto found = find_checkpoints(c.checkpoint.ckpt_dir);
  ASSERT_EQ(found.size(), 2u);
  EXPECT_EQ(found[0].first, 5);
  EXPECT_EQ(found[1].first, 4);
  for (const auto& e : fs::directory_iterator(c.checkpoint.ckpt_dir))
    EXPECT_EQ(e.path().filename().string().rfind("step_", 0), 0u) << e.path();
  EXPECT_EQ(std::distance(fs::directory_iterator(c.checkpoint.ckpt_dir), fs::directory_iterator()), 2);
}

// As left by a kill after a save's commit but before its retention ran (one checkpoint too many, a removal
// half done): the next run has nothing left to train, so its resume must tidy up.
TEST(CheckpointTrainer, ResumeAppliesRetentionLeftUndoneByAKill) {
  TrainConfig c = tiny("retention_on_resume");
  c.num_train_steps = 5;
  c.checkpoint.save_every_n_steps = 1;
  c.checkpoint.max_checkpoints = 0;
  run(c);
  fs::create_directory(c.checkpoint.ckpt_dir + "/step_1.trash");
  fs::create_directory(c.checkpoint.ckpt_dir + "/step_6.tmp");
  c.checkpoint.max_checkpoints = 3;
  run(c);
  const auto found = find_checkpoints(c.checkpoint.ckpt_dir);
  ASSERT_EQ(found.size(), 3u);
  EXPECT_EQ(found[0].first, 5);
  EXPECT_EQ(found[2].first, 3);
  EXPECT_EQ(std::distance(fs::directory_iterator(c.checkpoint.ckpt_dir), fs::directory_iterator()), 3);
}

// A saved run with checkpoints at steps 2 and 4; returns the config.
TrainConfig saved_run(const std::string& name) {
  TrainConfig c = tiny(name);
  c.num_train_steps = 4;
  run(c);
  return c;
}

std::string shard_of(const TrainConfig& c, int64_t step) {
  return c.checkpoint.ckpt_dir + "/step_" + std::to_string(step) + "/shard_00000.safetensors";
}

std::string load_error(const TrainConfig& c, int64_t step) {
  auto ops = make_cpu_ops();
  Trainer t(c, *ops, short_corpus());
  try {
    load_checkpoint(c.checkpoint.ckpt_dir + "/step_" + std::to_string(step), c, t.ckpt_state());
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

void flip_byte(const std::string& path, uint64_t at) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(at));
  char b = 0;
  f.read(&b, 1);
  b ^= 0x01;
  f.seekp(static_cast<std::streamoff>(at));
  f.write(&b, 1);
}

TEST(CheckpointErrors, FlippedByteInShardIsAChecksumMismatch) {
  const TrainConfig c = saved_run("flip");
  const std::string shard = shard_of(c, 4);
  flip_byte(shard, fs::file_size(shard) - 5);  // in the last tensor's data
  const std::string err = load_error(c, 4);
  EXPECT_NE(err.find(shard), std::string::npos) << err;
  EXPECT_NE(err.find("checksum mismatch in tensor 'expert.3.adam_v'"), std::string::npos) << err;
}

TEST(CheckpointErrors, FlippedByteInShardHeaderIsCaught) {
  const TrainConfig c = saved_run("flip_header");
  const std::string shard = shard_of(c, 4);
  flip_byte(shard, 20);  // inside the JSON header
  const std::string err = load_error(c, 4);
  EXPECT_NE(err.find(shard), std::string::npos) << err;
  EXPECT_NE(err.find("checksum mismatch in the header"), std::string::npos) << err;
}

TEST(CheckpointErrors, TruncatedShardIsNamed) {
  const TrainConfig c = saved_run("truncate");
  const std::string shard = shard_of(c, 4);
  const auto size = fs::file_size(shard);
  fs::resize_file(shard, size - 100);
  const std::string err = load_error(c, 4);
  EXPECT_NE(err.find(shard + ": truncated: " + std::to_string(size - 100) + " bytes, the manifest says " +
                     std::to_string(size)),
            std::string::npos)
      << err;
}

TEST(CheckpointErrors, MissingShardIsNamed) {
  const TrainConfig c = saved_run("missing");
  fs::remove(shard_of(c, 4));
  const std::string err = load_error(c, 4);
  EXPECT_NE(err.find(shard_of(c, 4) + ": missing"), std::string::npos) << err;
}

TEST(CheckpointErrors, IncompatibleModelShapeNamesTheKeyAndDoesNotFallBack) {
  TrainConfig c = saved_run("shape");
  c.model.intermediate_size = 64;
  c.num_train_steps = 6;
  auto ops = make_cpu_ops();
  Trainer t(c, *ops, short_corpus());
  try {
    t.run();
    FAIL() << "no error";
  } catch (const CheckpointIncompatible& e) {
    EXPECT_NE(std::string(e.what()).find("config_kwargs.intermediate_size is 48 there and 64 in this run"),
              std::string::npos)
        << e.what();
  }
}

TEST(CheckpointErrors, CorruptNewestFallsBackToThePreviousAndSaysSo) {
  TrainConfig c = saved_run("fallback");
  flip_byte(shard_of(c, 4), fs::file_size(shard_of(c, 4)) / 2);
  LogCapture log;
  auto ops = make_cpu_ops();
  Trainer t(c, *ops, short_corpus());
  Checkpointer k(c);
  EXPECT_EQ(k.resume(t.ckpt_state()), 2);
  EXPECT_EQ(t.step(), 2);
  const std::string text = log.text();
  EXPECT_NE(text.find("checksum mismatch"), std::string::npos) << text;
  EXPECT_NE(text.find("step_4 is unusable; falling back to the previous complete checkpoint"), std::string::npos)
      << text;
  EXPECT_NE(text.find("resumed from checkpoint " + c.checkpoint.ckpt_dir + "/step_2 at step 2"), std::string::npos)
      << text;
}

TEST(CheckpointErrors, DeletedManifestMeansIncompleteAndIsSkipped) {
  TrainConfig c = saved_run("no_manifest");
  fs::remove(c.checkpoint.ckpt_dir + "/step_4/manifest.json");
  LogCapture log;
  auto ops = make_cpu_ops();
  Trainer t(c, *ops, short_corpus());
  Checkpointer k(c);
  EXPECT_EQ(k.resume(t.ckpt_state()), 2);
  EXPECT_NE(log.text().find("step_4 has no manifest.json: not a complete checkpoint, skipped"), std::string::npos)
      << log.text();
}

TEST(CheckpointErrors, NoUsableCheckpointIsAnErrorNotAFreshStart) {
  TrainConfig c = saved_run("none_usable");
  fs::remove(shard_of(c, 2));
  fs::remove(shard_of(c, 4));
  auto ops = make_cpu_ops();
  Trainer t(c, *ops, short_corpus());
  Checkpointer k(c);
  try {
    k.resume(t.ckpt_state());
    FAIL() << "no error";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("no usable checkpoint in " + c.checkpoint.ckpt_dir), std::string::npos);
  }
}

// Turns the injected disk faults off at the end of a test, whatever happens in it.
struct FaultGuard {
  ~FaultGuard() {
    ckpt::testing::fail_writes_after(-1);
    ckpt::testing::set_free_bytes(-1);
  }
};

TEST(CheckpointErrors, FullDiskNamesTheFileAndKeepsThePreviousCheckpoint) {
  FaultGuard guard;
  TrainConfig c = saved_run("enospc");
  auto ops = make_cpu_ops();
  Trainer t(c, *ops, short_corpus());
  Checkpointer k(c);
  ASSERT_EQ(k.resume(t.ckpt_state()), 4);
  t.train_step();
  ckpt::testing::fail_writes_after(5000);
  try {
    k.save(t.ckpt_state());
    FAIL() << "no error";
  } catch (const CheckpointError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("step_5.tmp/shard_00000.safetensors: write failed after"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::strerror(ENOSPC)), std::string::npos) << msg;
  }
  ckpt::testing::fail_writes_after(-1);
  EXPECT_EQ(find_checkpoints(c.checkpoint.ckpt_dir).front().first, 4);
  EXPECT_FALSE(fs::exists(c.checkpoint.ckpt_dir + "/step_5.tmp"));
  EXPECT_FALSE(fs::exists(c.checkpoint.ckpt_dir + "/step_5"));

  // Not enough free space is refused before writing.
  ckpt::testing::set_free_bytes(1000);
  try {
    k.save(t.ckpt_state());
    FAIL() << "no error";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("shard_00000.safetensors: no space left on the device: it needs"),
              std::string::npos)
        << e.what();
  }
  ckpt::testing::set_free_bytes(-1);
}

TEST(CheckpointErrors, AsyncSaveFailureSurfacesAtFinish) {
  FaultGuard guard;
  TrainConfig c = saved_run("async_fail");
  c.checkpoint.async_save = true;
  auto ops = make_cpu_ops();
  Trainer t(c, *ops, short_corpus());
  Checkpointer k(c);
  ASSERT_EQ(k.resume(t.ckpt_state()), 4);
  t.train_step();
  ckpt::testing::fail_writes_after(5000);
  k.save(t.ckpt_state());  // returns at once; the write fails in the background
  try {
    k.finish();
    ckpt::testing::fail_writes_after(-1);
    FAIL() << "no error";
  } catch (const CheckpointError& e) {
    ckpt::testing::fail_writes_after(-1);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("the asynchronous save of checkpoint step_5 failed"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::strerror(ENOSPC)), std::string::npos) << msg;
  }
  EXPECT_EQ(find_checkpoints(c.checkpoint.ckpt_dir).front().first, 4);
}

TEST(CheckpointMetrics, TruncateDropsLaterStepsAndTornLines) {
  const fs::path p = fs::temp_directory_path() / "mxtrain_ckpt_metrics_trim.jsonl";
  {
    std::ofstream out(p);
    out << "{\"step\":1,\"loss\":5}\n{\"step\":2,\"loss\":4}\n{\"step\":3,\"loss\":3}\n{\"step\":4,\"lo";
  }
  truncate_metrics_after(p.string(), 2);
  std::ifstream in(p);
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(text, "{\"step\":1,\"loss\":5}\n{\"step\":2,\"loss\":4}\n");
  truncate_metrics_after((fs::temp_directory_path() / "mxtrain_no_such_metrics.jsonl").string(), 2);  // fine
}

}  // namespace
}  // namespace mxt
