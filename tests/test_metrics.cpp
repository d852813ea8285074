// MetricsLog: the console line's format, the JSON lines (parsed back), truncate/append, directory creation,
// open errors; format_duration.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include "mxtrain/metrics.hpp"
#include "mxtrain/params.hpp"

namespace fs = std::filesystem;
using mxt::MetricsLog;
using mxt::StepMetrics;

namespace {

class MetricsDir : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "mxtrain_metrics_XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    // Send spdlog to a string for the duration of the test; the message only, no timestamp.
    saved_ = spdlog::default_logger();
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(console_);
    auto logger = std::make_shared<spdlog::logger>("metrics_test", sink);
    logger->set_pattern("%v");
    spdlog::set_default_logger(logger);
  }
  void TearDown() override {
    spdlog::set_default_logger(saved_);
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::vector<nlohmann::json> read_jsonl(const fs::path& p) {
    std::ifstream in(p);
    std::vector<nlohmann::json> rows;
    for (std::string line; std::getline(in, line);) rows.push_back(nlohmann::json::parse(line));
    return rows;
  }
  static StepMetrics sample(int64_t step) {
    StepMetrics m;
    m.step = step;
    m.total_steps = 120;
    m.loss = 5.4321;
    m.lr = 1.2e-3;
    m.grad_norm = 0.812;
    m.tokens_per_s = 10234;
    m.elapsed_s = 12;
    m.eta_s = 108;
    m.tokens = step * 4096;
    m.flops_per_s_per_rank = 473.66e12;
    return m;
  }
  fs::path dir_;
  std::ostringstream console_;
  std::shared_ptr<spdlog::logger> saved_;
};

}  // namespace

TEST_F(MetricsDir, ConsoleLineFormat) {
  MetricsLog log("");
  log.log(sample(12));
  EXPECT_EQ(console_.str(),
            "step 12/120 | loss 5.4321 | lr 1.20e-03 | grad_norm 0.812 | 10.2k tok/s | 473.7 TFLOP/s per rank | "
            "elapsed 12s | eta 1m48s\n");
  console_.str("");
  StepMetrics m = sample(3);
  m.aux_loss = 0.0125;
  m.tokens_per_s = 2.5e6;
  log.log(m);
  EXPECT_NE(console_.str().find("| aux_loss 0.0125 |"), std::string::npos) << console_.str();
  EXPECT_NE(console_.str().find("2.50M tok/s"), std::string::npos) << console_.str();
  console_.str("");
  m.flops_per_s_per_rank = 3.9e10;  // a CPU rank
  log.log(m);
  EXPECT_NE(console_.str().find("| 39.0 GFLOP/s per rank |"), std::string::npos) << console_.str();
}

TEST_F(MetricsDir, JsonLinesParseBackAndCreateDirectories) {
  const fs::path p = dir_ / "run" / "logs" / "metrics.jsonl";  // parent directories do not exist yet
  {
    MetricsLog log(p.string());
    for (int64_t s = 1; s <= 3; ++s) {
      StepMetrics m = sample(s);
      m.aux_loss = 0.01 * s;
      log.log(m);
      EXPECT_EQ(read_jsonl(p).size(), static_cast<size_t>(s));  // flushed per line, before close
    }
  }
  const auto rows = read_jsonl(p);
  ASSERT_EQ(rows.size(), 3u);
  for (int64_t s = 1; s <= 3; ++s) {
    const auto& j = rows[s - 1];
    EXPECT_EQ(j.size(), 11u);
    EXPECT_EQ(j.at("step").get<int64_t>(), s);
    EXPECT_EQ(j.at("total_steps").get<int64_t>(), 120);
    EXPECT_EQ(j.at("loss").get<double>(), 5.4321);  // shortest round-trip text: exact
    EXPECT_EQ(j.at("lr").get<double>(), 1.2e-3);
    EXPECT_EQ(j.at("grad_norm").get<double>(), 0.812);
    EXPECT_EQ(j.at("aux_loss").get<double>(), 0.01 * s);
    EXPECT_EQ(j.at("tokens").get<int64_t>(), s * 4096);
    EXPECT_EQ(j.at("tokens_per_s").get<double>(), 10234.0);
    EXPECT_EQ(j.at("elapsed_s").get<double>(), 12.0);
    EXPECT_EQ(j.at("eta_s").get<double>(), 108.0);
    EXPECT_DOUBLE_EQ(j.at("tflops_per_rank").get<double>(), 473.66);
  }
}

TEST_F(MetricsDir, TruncateOrAppend) {
  const fs::path p = dir_ / "m.jsonl";
  { MetricsLog(p.string()).log(sample(1)); }
  { MetricsLog(p.string(), /*append=*/true).log(sample(2)); }
  auto rows = read_jsonl(p);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[1].at("step").get<int64_t>(), 2);
  { MetricsLog(p.string()).log(sample(7)); }  // a fresh run starts the file over
  rows = read_jsonl(p);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].at("step").get<int64_t>(), 7);
}

TEST_F(MetricsDir, NonFiniteLossStaysValidJson) {
  const fs::path p = dir_ / "nan.jsonl";
  {
    MetricsLog log(p.string());
    StepMetrics m = sample(1);
    m.loss = std::nan("");
    log.log(m);
  }
  const auto rows = read_jsonl(p);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_TRUE(rows[0].at("loss").is_null());
}

TEST_F(MetricsDir, UnopenablePathNamed) {
  const fs::path blocker = dir_ / "file";
  std::ofstream(blocker) << "x";
  const std::string p = (blocker / "metrics.jsonl").string();  // its "directory" is a regular file
  try {
    MetricsLog log(p);
    FAIL() << "expected std::runtime_error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

TEST(FormatDuration, Shapes) {
  EXPECT_EQ(mxt::format_duration(0), "0s");
  EXPECT_EQ(mxt::format_duration(12.3), "12s");
  EXPECT_EQ(mxt::format_duration(59.6), "1m00s");
  EXPECT_EQ(mxt::format_duration(108), "1m48s");
  EXPECT_EQ(mxt::format_duration(245), "4m05s");
  EXPECT_EQ(mxt::format_duration(3723), "1h02m03s");
  EXPECT_EQ(mxt::format_duration(100 * 3600 + 5), "100h00m05s");
  EXPECT_EQ(mxt::format_duration(-1), "?");
  EXPECT_EQ(mxt::format_duration(INFINITY), "?");
}

// The HF baseline's FLOP formula (shared/bench/hf_baseline.py flops_per_token), whose values for its presets at
// their sequence lengths were computed by that Python function: the TFLOP/s mxtrain logs compare with its.
TEST(ModelFlops, EqualsTheHfBaselinesFormula) {
  auto shape = [](int64_t d, int64_t f, int64_t layers, int64_t heads, int64_t kv, int64_t experts) {
    mxt::ModelConfig m;
    m.vocab_size = 128256;
    m.hidden_size = d;
    m.intermediate_size = f;
    m.num_hidden_layers = layers;
    m.num_attention_heads = heads;
    m.num_key_value_heads = kv;
    m.num_local_experts = experts;
    m.num_experts_per_tok = 2;
    return m;
  };
  EXPECT_EQ(mxt::model_flops_per_token(shape(4096, 14336, 32, 32, 8, 8), 4096), 82078334976.0);  // 8x7B
  EXPECT_EQ(mxt::model_flops_per_token(shape(2048, 4096, 16, 16, 8, 8), 4096), 8422686720.0);    // 8x1B
  EXPECT_EQ(mxt::model_flops_per_token(shape(256, 512, 2, 4, 2, 4), 128), 209203200.0);          // L0_sanity
  EXPECT_EQ(mxt::model_flops_per_token(mxt::ModelConfig{}, 128), 0.0);  // no heads: no model
}
