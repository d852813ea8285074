// router_force_load_balancing (benchmarking only): every token goes to the experts k*t, k*t + 1, ... (mod E), so
// each expert receives exactly T*k/E rows of a micro-batch whatever the router weights, as Megatron-Core's
// --moe-router-force-load-balancing does for its benchmarks. The router still runs forward and backward.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <sstream>
#include <vector>

#include <spdlog/sinks/ostream_sink.h>
#include <yaml-cpp/yaml.h>
#include <spdlog/spdlog.h>

#include "tiny_config.hpp"
#include "trained_run.hpp"
#include "mxtrain/config.hpp"
#include "mxtrain/data.hpp"
#include "mxtrain/model.hpp"
#include "mxtrain/ops.hpp"
#include "mxtrain/params.hpp"
#include "mxtrain/trainer.hpp"

namespace mxt::testing {
namespace {

// Rows per expert over all layers after one forward + backward of a random micro-batch (B*S tokens).
std::vector<std::vector<int64_t>> rows_per_expert(bool force, std::vector<std::vector<int32_t>>* picks = nullptr) {
  ModelConfig cfg = tiny_model(61, 32, 48);
  cfg.num_local_experts = 8;
  cfg.router_force_load_balancing = force;
  const ParamLayout layout = ParamLayout::build(cfg, 0, cfg.num_local_experts);
  std::vector<float> dense, expert, gd, ge;
  init_params_host(layout, cfg, 11, dense, expert);
  gd.assign(dense.size(), 0.f);
  ge.assign(expert.size(), 0.f);
  const int64_t B = 2, S = 16, T = B * S;
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> tok(0, static_cast<int>(cfg.vocab_size) - 1);
  std::vector<int32_t> ids, labels, pos;
  for (int64_t i = 0; i < T; ++i) {
    ids.push_back(tok(rng));
    labels.push_back(tok(rng));
    pos.push_back(static_cast<int32_t>(i % S));
  }
  auto ops = make_cpu_ops();
  MixtralModel model(cfg, *ops, B, S, layout);
  model.bind(Tensor(dense.data(), DType::F32, {(int64_t)dense.size()}),
             Tensor(expert.data(), DType::F32, {(int64_t)expert.size()}),
             Tensor(gd.data(), DType::F32, {(int64_t)gd.size()}), Tensor(ge.data(), DType::F32, {(int64_t)ge.size()}));
  MicroBatch mb{Tensor(ids.data(), DType::I32, {T}), Tensor(labels.data(), DType::I32, {T}),
                Tensor(pos.data(), DType::I32, {T})};
  float sum = 0;
  model.forward_backward(mb, 1.f / T, 1.f, Tensor(&sum, DType::F32, {1}), true, 1);
  std::vector<std::vector<int64_t>> rows;
  for (int l = 0; l < cfg.num_hidden_layers; ++l) {
    const Tensor& idx = model.topk_indices(l);
    const auto* p = static_cast<const int32_t*>(idx.data);
    std::vector<int64_t> r(cfg.num_local_experts, 0);
    for (int64_t i = 0; i < idx.numel(); ++i) ++r[p[i]];
    rows.push_back(r);
    if (picks) picks->emplace_back(p, p + idx.numel());
  }
  return rows;
}

TEST(ForcedBalance, EveryExpertGetsTheSameRowsInARoundRobin) {
  std::vector<std::vector<int32_t>> picks;
  for (const auto& layer : rows_per_expert(true, &picks))
    for (int64_t r : layer) EXPECT_EQ(r, 2 * 32 / 8);  // T*k/E
  for (const auto& p : picks)
    for (size_t i = 0; i < p.size(); ++i) EXPECT_EQ(p[i], static_cast<int32_t>(i % 8)) << "row " << i;
  // Without the key the same weights and tokens route unevenly, so the test above can tell the two apart.
  bool uneven = false;
  for (const auto& layer : rows_per_expert(false))
    for (int64_t r : layer) uneven = uneven || r != 8;
  EXPECT_TRUE(uneven);
}

TEST(ForcedBalance, TrainsAndSaysSoAtStart) {
  TrainConfig c = tiny_config("mxtrain_test_forced_balance");
  c.num_train_steps = 8;
  c.lr_scheduler = {1, 7, 0.1};
  c.model.router_force_load_balancing = true;
  std::ostringstream out;
  auto saved = spdlog::default_logger();
  spdlog::set_default_logger(
      std::make_shared<spdlog::logger>("forced_balance_test", std::make_shared<spdlog::sinks::ostream_sink_mt>(out)));
  auto ops = make_cpu_ops();
  const TrainedRun r = train_to_end(c, *ops);
  spdlog::set_default_logger(saved);
  EXPECT_NE(out.str().find("router_force_load_balancing=true (benchmarking only)"), std::string::npos) << out.str();
  EXPECT_LT(r.losses.back(), r.losses.front());
}

TEST(ForcedBalance, ConfigKey) {
  auto key = [](std::vector<std::string> o) {
    return to_train_config(resolve_config(LoadOptions{"L0_sanity", "", std::move(o)})).model.router_force_load_balancing;
  };
  EXPECT_FALSE(key({}));
  EXPECT_TRUE(key({"router_force_load_balancing=true"}));
  try {
    key({"router_force_load_balancing=maybe"});
    ADD_FAILURE() << "router_force_load_balancing=maybe was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("router_force_load_balancing"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mxt::testing
