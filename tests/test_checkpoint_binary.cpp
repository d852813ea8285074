// Checkpoints through the mxtrain executable and its real command line: 8 steps straight versus 4 steps,
// exit, resume for 4 more: the same loss at every step, bit for bit, and one metrics line per step; a
// checkpoint of another model shape is a config error naming the key.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "binary_test_util.hpp"
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

using mxt::testing::RunResult;
RunResult run(const std::string& args) { return mxt::testing::run_mxtrain(args); }

const char* kTiny =
    "--config-name L0_sanity parallelism.ep_size=1 backend=cpu config_kwargs.vocab_size=256 "
    "config_kwargs.hidden_size=32 config_kwargs.intermediate_size=48 config_kwargs.num_attention_heads=4 "
    "config_kwargs.num_key_value_heads=2 config_kwargs.router_jitter_noise=0.05 dataset.max_seq_length=32 "
    "dataset.stride=8 grad_acc_steps=2 lr_scheduler_kwargs.num_warmup_steps=2 "
    "lr_scheduler_kwargs.num_decay_steps=10 logger.frequency=1 checkpoint.save_final_model=false";

// step -> loss, from a metrics file (each step must appear once).
std::map<int64_t, double> losses(const fs::path& metrics) {
  std::map<int64_t, double> out;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    EXPECT_TRUE(out.emplace(j["step"].get<int64_t>(), j["loss"].get<double>()).second) << "repeated: " << line;
  }
  return out;
}

fs::path fresh(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("mxtrain_ckpt_binary_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

TEST(CheckpointBinary, StopAndResumeGivesTheSameLossesBitForBit) {
  const fs::path d = fresh("resume");
  const std::string straight = std::string(kTiny) + " num_train_steps=8 output_dir=" + (d / "straight").string();
  RunResult r = run(straight);
  ASSERT_EQ(r.exit_code, 0) << r.output;

  const std::string resumed = std::string(kTiny) + " output_dir=" + (d / "resumed").string() +
                              " checkpoint.ckpt_dir=" + (d / "ckpt").string() + " checkpoint.save_every_n_steps=4";
  r = run(resumed + " num_train_steps=4");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(d / "ckpt/step_4/manifest.json"));
  r = run(resumed + " num_train_steps=8");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("resumed from checkpoint " + (d / "ckpt/step_4").string() + " at step 4"));
  EXPECT_THAT(r.output, HasSubstr("config changed since the checkpoint: num_train_steps: 4 -> 8"));

  const auto a = losses(d / "straight/metrics.jsonl"), b = losses(d / "resumed/metrics.jsonl");
  ASSERT_EQ(a.size(), 8u);
  ASSERT_EQ(b.size(), 8u);
  for (const auto& [step, loss] : a) EXPECT_EQ(b.at(step), loss) << "step " << step;
}

TEST(CheckpointBinary, AnotherModelShapeIsAConfigErrorNamingTheKey) {
  const fs::path d = fresh("shape");
  const std::string base = std::string(kTiny) + " output_dir=" + (d / "out").string() +
                           " checkpoint.ckpt_dir=" + (d / "ckpt").string() + " checkpoint.save_every_n_steps=2";
  RunResult r = run(base + " num_train_steps=2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run(base + " num_train_steps=4 config_kwargs.num_hidden_layers=3");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("config_kwargs.num_hidden_layers is 2 there and 3 in this run"));
}

}  // namespace
