// The mxtrain executable end to end: bad input gives a message naming the problem and a non-zero exit before
// any work; a short run trains, writes metrics and repeats exactly with the same seed.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "binary_test_util.hpp"
#include <nlohmann/json.hpp>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

using mxt::testing::RunResult;
RunResult run(const std::string& args) { return mxt::testing::run_mxtrain(args); }

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("mxtrain_binary_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// A tiny model on the embedded corpus so a run takes well under a second.
const char* kTiny =
    "parallelism.ep_size=1 backend=cpu config_kwargs.vocab_size=256 config_kwargs.hidden_size=32 "
    "config_kwargs.intermediate_size=48 config_kwargs.num_attention_heads=4 config_kwargs.num_key_value_heads=2 "
    "dataset.max_seq_length=32 dataset.stride=8 lr_scheduler_kwargs.num_warmup_steps=2 "
    "lr_scheduler_kwargs.num_decay_steps=10 num_train_steps=12";

TEST(Binary, UnknownKeySuggestsTheNearestOne) {
  const RunResult r = run("--config-name L0_sanity dataset.micro_batch_sise=2");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("dataset.micro_batch_sise"));
  EXPECT_THAT(r.output, HasSubstr("dataset.micro_batch_size"));
}

TEST(Binary, WrongTypeNamesKeyAndValue) {
  const RunResult r = run("--config-name L0_sanity num_train_steps=many");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("num_train_steps"));
  EXPECT_THAT(r.output, HasSubstr("many"));
}

TEST(Binary, IndivisibleShapesAreRejected) {
  RunResult r = run("--config-name L0_sanity parallelism.ep_size=1 config_kwargs.hidden_size=250");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("config_kwargs.hidden_size"));
  r = run("--config-name L0_sanity parallelism.ep_size=1 config_kwargs.num_key_value_heads=3");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("config_kwargs.num_key_value_heads"));
  r = run("--config-name L0_sanity parallelism.ep_size=3");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("parallelism.ep_size"));
}

TEST(Binary, WorldSizeMustMatchDpTimesEp) {
  // L0_sanity asks for EP=2: one process is not enough.
  const RunResult r = run("--config-name L0_sanity");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("parallelism.dp_size"));
  EXPECT_THAT(r.output, HasSubstr("1 rank"));
}

TEST(Binary, MissingDataFileIsNamed) {
  const RunResult r =
      run("--config-name L0_sanity parallelism.ep_size=1 dataset.source=fasta dataset.paths=[/no/such/genome.fa]");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("/no/such/genome.fa"));
}

TEST(Binary, MalformedFastaIsNamedWithItsRecord) {
  const fs::path d = temp_dir("badfasta");
  std::ofstream(d / "bad.fa") << ">ok\nACGT\n>broken\nAC#GT\n";
  const RunResult r = run("--config-name L0_sanity parallelism.ep_size=1 dataset.source=fasta dataset.paths=[" +
                          (d / "bad.fa").string() + "]");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("bad.fa"));
  EXPECT_THAT(r.output, HasSubstr("broken"));
}

TEST(Binary, DryRunPrintsThePlanWithoutTraining) {
  const RunResult r = run("--config-name L1_8x7B_ep --dry-run");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("memory plan per rank"));
  EXPECT_THAT(r.output, HasSubstr("1 of 8 experts"));  // EP=8
  // 47.5 B parameters x 12 bytes (fp32 master, two AdamW moments): more than the 8-GPU machine's 235 GB disk
  EXPECT_THAT(r.output, HasSubstr("checkpoint: 569.9 GB per save"));
}

// The plan needs only the backend's dtype: backend=cuda plans the bf16 run here, GPU or not, and with MXFP8
// it has no bf16 working copy of the experts.
TEST(Binary, DryRunPlansTheCudaRunWithoutAGpu) {
  const RunResult r = run("--config-name L0_sanity --dry-run backend=cuda fp8_config.enabled=true");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("activations bf16"));
  EXPECT_THAT(r.output, HasSubstr("experts: none"));
  EXPECT_THAT(r.output, HasSubstr("MXFP8 weight copies"));
  // L0_sanity: 128 tokens per micro-batch, all of whose logits fit the default chunk (4096 tokens)
  EXPECT_THAT(r.output, HasSubstr("LM-head logits (128 tokens at a time, lm_head_chunk_tokens)"));
}

// backend=cuda-fp32 plans fp32 activations (and so no bf16 working copies), GPU or not.
TEST(Binary, DryRunPlansTheFp32CudaRun) {
  const RunResult r = run("--config-name L0_sanity --dry-run backend=cuda-fp32");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("activations f32"));
  EXPECT_THAT(r.output, ::testing::Not(HasSubstr("activations bf16")));
}

TEST(Binary, TrainsOnFastaAndRepeatsExactly) {
  const fs::path d = temp_dir("fasta");
  {
    std::ofstream f(d / "genome.fa");
    for (int r = 0; r < 20; ++r) {
      f << ">chr" << r << "\n";
      for (int l = 0; l < 4; ++l) f << "ACGTTGCAACGGATCCATGGCCTTAAGGACGTACGT\n";
    }
  }
  const std::string common = std::string(kTiny) + " dataset.source=fasta dataset.paths=[" +
                             (d / "genome.fa").string() + "] ";
  const RunResult a = run(common + "output_dir=" + (d / "a").string());
  const RunResult b = run(common + "output_dir=" + (d / "b").string());
  ASSERT_EQ(a.exit_code, 0) << a.output;
  ASSERT_EQ(b.exit_code, 0) << b.output;
  auto losses = [](const fs::path& metrics) {
    std::ifstream f(metrics);
    std::vector<std::string> out;
    std::string line;
    while (std::getline(f, line)) out.push_back(line.substr(0, line.find("\"tokens_per_s\"")));
    return out;
  };
  const auto la = losses(d / "a" / "metrics.jsonl"), lb = losses(d / "b" / "metrics.jsonl");
  ASSERT_EQ(la.size(), 12u);  // logger.frequency 1 in L0_sanity
  EXPECT_EQ(la, lb);          // step, loss, lr, grad norm: identical text
  EXPECT_THAT(a.output, HasSubstr("step 12/12"));
  EXPECT_THAT(a.output, HasSubstr("eta"));
}

// --dump-first-batch (the parity script's input): the loss, the tokens, and per layer the experts each token was
// routed to (T x k indices in [0, E)).
TEST(Binary, DumpFirstBatchWritesLossTokensAndRouting) {
  const fs::path d = temp_dir("dump");
  const RunResult r = run(std::string("--config-name L0_sanity ") + kTiny + " --dump-first-batch " + (d / "dump").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream f(d / "dump" / "loss.json");
  const nlohmann::json j = nlohmann::json::parse(f);
  EXPECT_GT(j["loss"].get<double>(), 0.0);
  const size_t T = j["input_ids"].size();
  EXPECT_EQ(T, 32u);
  ASSERT_EQ(j["topk"].size(), 2u);  // L0_sanity's layers
  for (const auto& layer : j["topk"]) {
    ASSERT_EQ(layer.size(), 2 * T);  // top-2
    for (size_t t = 0; t < T; ++t) {
      const int a = layer[2 * t].get<int>(), b = layer[2 * t + 1].get<int>();
      EXPECT_TRUE(a >= 0 && a < 4 && b >= 0 && b < 4 && a != b) << t << ": " << a << ", " << b;
    }
  }
  EXPECT_TRUE(fs::exists(d / "dump" / "logits.safetensors"));
  EXPECT_TRUE(fs::exists(d / "dump" / "grads"));
}

}  // namespace
