// The held-out loss (validation.*): what evaluate() computes, that it leaves training untouched, and its metrics
// file across a resume. CPU backend, one rank; tests/mpi/mpi_equivalence.cpp checks it over EP and DP ranks.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "cpu/cpu_ops.hpp"
#include "mxtrain/data.hpp"
#include "mxtrain/trainer.hpp"
#include "tiny_config.hpp"

namespace mxt {
namespace {

namespace fs = std::filesystem;

std::vector<int32_t> train_tokens() {
  std::vector<int32_t> t = embedded_corpus_tokens();
  t.resize(40000);
  return t;
}
std::vector<int32_t> held_out_tokens() {
  const std::vector<int32_t> all = embedded_corpus_tokens();
  return std::vector<int32_t>(all.end() - 20000, all.end());
}

TrainConfig config(const std::string& name) {
  TrainConfig c = testing::tiny_config("unused");
  const fs::path root = fs::temp_directory_path() / ("mxtrain_validation_" + name);
  fs::remove_all(root);
  c.output_dir = (root / "out").string();
  c.num_train_steps = 6;
  c.validation.num_batches = 3;
  return c;
}

std::vector<nlohmann::json> lines(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string l; std::getline(in, l);) out.push_back(nlohmann::json::parse(l));
  return out;
}

// On the training data itself, before any step, the held-out loss is the first step's loss: the same forward
// over the same micro-batches (full windows: every micro-batch has as many labelled tokens, so the token mean
// equals the step's mean of micro-batch means).
TEST(Validation, OnTheTrainingDataItIsTheFirstStepsLoss) {
  TrainConfig c = config("first_step");
  c.validation.num_batches = c.grad_acc_steps;
  auto ops = make_cpu_ops();
  Trainer t(c, *ops, train_tokens());
  t.set_validation_data(train_tokens());
  const ValidationResult v = t.evaluate();
  EXPECT_EQ(v.tokens, c.grad_acc_steps * c.dataset.micro_batch_size * (c.dataset.max_seq_length - 1));
  const StepResult r = t.train_step();
  EXPECT_NEAR(v.loss, r.loss, 1e-6 * r.loss);
  for (int i = 0; i < 3; ++i) t.train_step();  // past the warm-up's lr 0 at step 1
  const ValidationResult after = t.evaluate();   // the weights moved: the same data, a lower loss
  EXPECT_LT(after.loss, v.loss);
}

TEST(Validation, LeavesTrainingUntouchedAndLogsEachEvaluation) {
  TrainConfig c = config("untouched");
  c.model.router_jitter_noise = 0.05;  // its random stream must not move either
  auto ops = make_cpu_ops();
  std::vector<double> plain;
  {
    Trainer t(c, *ops, train_tokens());
    plain = t.run();
  }
  c.validation.every_n_steps = 2;
  Trainer t(c, *ops, train_tokens());
  t.set_validation_data(held_out_tokens());
  EXPECT_EQ(t.run(), plain);  // bit for bit
  const auto v = lines(c.output_dir + "/validation.jsonl");
  ASSERT_EQ(v.size(), 3u);  // steps 2, 4, 6 (the last)
  for (size_t i = 0; i < v.size(); ++i) {
    EXPECT_EQ(v[i]["step"].get<int64_t>(), static_cast<int64_t>(2 * (i + 1)));
    EXPECT_EQ(v[i]["tokens"].get<int64_t>(), 3 * 2 * 31);  // 3 micro-batches of 2 windows of 31 labelled tokens
    EXPECT_NEAR(v[i]["val_perplexity"].get<double>(), std::exp(v[i]["val_loss"].get<double>()), 1e-9);
  }
  EXPECT_LT(v.back()["val_loss"].get<double>(), v.front()["val_loss"].get<double>());
  // Repeated, the evaluation gives the same number (the same micro-batches every time).
  const ValidationResult a = t.evaluate(), b = t.evaluate();
  EXPECT_EQ(a.loss, b.loss);
  EXPECT_EQ(a.loss, v.back()["val_loss"].get<double>());
}

// A run that died after evaluating step 6 but before its checkpoint: the resume drops that line, and the
// evaluation of step 6 is logged once.
TEST(Validation, ResumeLogsEachEvaluationOnce) {
  TrainConfig c = config("resume");
  c.validation.every_n_steps = 2;
  c.checkpoint.ckpt_dir = (fs::path(c.output_dir).parent_path() / "ckpt").string();
  c.checkpoint.save_every_n_steps = 2;
  c.checkpoint.resume_from_checkpoint = true;
  c.checkpoint.save_final_model = false;
  c.num_train_steps = 4;
  auto ops = make_cpu_ops();
  {
    Trainer t(c, *ops, train_tokens());
    t.set_validation_data(held_out_tokens());
    t.run();
  }
  std::ofstream(c.output_dir + "/validation.jsonl", std::ios::app) << R"({"step":6,"val_loss":9.0})" << "\n";
  c.num_train_steps = 6;
  Trainer t(c, *ops, train_tokens());
  t.set_validation_data(held_out_tokens());
  t.run();
  std::vector<int64_t> steps;
  for (const auto& j : lines(c.output_dir + "/validation.jsonl")) {
    steps.push_back(j["step"].get<int64_t>());
    EXPECT_LT(j["val_loss"].get<double>(), 9.0);
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{2, 4, 6}));
}

}  // namespace
}  // namespace mxt
