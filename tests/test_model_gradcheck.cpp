// Whole-model gradient check: for every parameter tensor, the analytic gradient's projection on a random
// direction must match a central finite difference of the loss along that direction.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "mxtrain/model.hpp"
#include "mxtrain/ops.hpp"
#include "mxtrain/params.hpp"
#include "tiny_config.hpp"

namespace mxt {
namespace {

using mxt::testing::tiny_model;

ModelConfig gradcheck_model() {
  ModelConfig m = tiny_model(37, 16, 24, 16);
  m.rope_theta = 10000;
  m.initializer_range = 0.3;  // large enough that every path carries a sizeable gradient
  return m;
}

struct Harness {
  ModelConfig cfg;
  std::unique_ptr<Ops> ops = make_cpu_ops();
  ParamLayout layout;
  std::vector<float> dense, expert, gdense, gexpert;
  std::vector<int32_t> ids, labels, pos;
  std::unique_ptr<MixtralModel> model;
  int64_t B = 2, S = 8;

  explicit Harness(const ModelConfig& c) : cfg(c) {
    layout = ParamLayout::build(cfg, 0, cfg.num_local_experts);
    init_params_host(layout, cfg, 7, dense, expert);
    // Norm weights away from 1 so their gradients are tested on a non-trivial point.
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> u(0.5f, 1.5f);
    for (const auto& p : layout.params)
      if (p.is_norm)
        for (int64_t i = 0; i < p.numel; ++i) dense[p.offset + i] = u(rng);
    gdense.assign(dense.size(), 0.f);
    gexpert.assign(expert.size(), 0.f);
    std::uniform_int_distribution<int> tok(0, static_cast<int>(cfg.vocab_size) - 1);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t s = 0; s < S; ++s) {
        ids.push_back(tok(rng));
        pos.push_back(static_cast<int32_t>(s));
      }
    for (int64_t b = 0; b < B; ++b)
      for (int64_t s = 0; s < S; ++s) labels.push_back(s + 1 < S ? ids[b * S + s + 1] : -100);
    labels[3] = -100;  // an ignored token inside a row
    model = std::make_unique<MixtralModel>(cfg, *ops, B, S, layout);
    model->bind(Tensor(dense.data(), DType::F32, {(int64_t)dense.size()}),
                Tensor(expert.data(), DType::F32, {(int64_t)expert.size()}),
                Tensor(gdense.data(), DType::F32, {(int64_t)gdense.size()}),
                Tensor(gexpert.data(), DType::F32, {(int64_t)gexpert.size()}));
  }

  // Loss = mean token CE (+ coef * aux); gradients accumulate into gdense/gexpert.
  double loss() {
    MicroBatch mb{Tensor(ids.data(), DType::I32, {B * S}), Tensor(labels.data(), DType::I32, {B * S}),
                  Tensor(pos.data(), DType::I32, {B * S})};
    float sum = 0;
    Tensor loss_sum(&sum, DType::F32, {1});
    int64_t n = 0;
    for (auto l : labels) n += l >= 0;
    const double aux = model->forward_backward(mb, 1.f / n, 1.f, loss_sum, true, 1234);
    return static_cast<double>(sum) / n + cfg.router_aux_loss_coef * aux;
  }
};

void check_all_params(const ModelConfig& cfg) {
  Harness h(cfg);
  h.loss();
  const std::vector<float> gd = h.gdense, ge = h.gexpert;
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (const ParamInfo& p : h.layout.params) {
    std::vector<float>& w = p.expert ? h.expert : h.dense;
    const std::vector<float>& g = p.expert ? ge : gd;
    std::vector<float> dir(p.numel);
    double norm = 0;
    for (auto& x : dir) {
      x = nd(rng);
      norm += x * x;
    }
    double analytic = 0;
    for (int64_t i = 0; i < p.numel; ++i) {
      dir[i] = static_cast<float>(dir[i] / std::sqrt(norm));
      analytic += static_cast<double>(dir[i]) * g[p.offset + i];
    }
    const float eps = 1e-2f;
    std::vector<float> saved(w.begin() + p.offset, w.begin() + p.offset + p.numel);
    for (int64_t i = 0; i < p.numel; ++i) w[p.offset + i] = saved[i] + eps * dir[i];
    const double lp = h.loss();
    for (int64_t i = 0; i < p.numel; ++i) w[p.offset + i] = saved[i] - eps * dir[i];
    const double lm = h.loss();
    std::copy(saved.begin(), saved.end(), w.begin() + p.offset);
    const double numeric = (lp - lm) / (2.0 * eps);
    EXPECT_NEAR(analytic, numeric, 2e-2 * std::abs(numeric) + 2e-4)
        << p.name << ": analytic " << analytic << " numeric " << numeric;
    // The check is only meaningful where the loss depends on the tensor.
    EXPECT_GT(std::abs(numeric), 1e-4) << p.name << " has a vanishing directional derivative";
  }
}

TEST(ModelGradcheck, EveryParameterTensor) { check_all_params(gradcheck_model()); }

TEST(ModelGradcheck, WithAuxLossAndRouterJitter) {
  ModelConfig m = gradcheck_model();
  m.router_aux_loss_coef = 0.5;  // large so its gradient is visible beside the CE gradient
  m.router_jitter_noise = 0.1;
  check_all_params(m);
}

TEST(ModelGradcheck, AuxLossMatchesHfFormula) {
  ModelConfig m = gradcheck_model();
  m.router_aux_loss_coef = 1.0;
  Harness h(m);
  const double total = h.loss();
  m.router_aux_loss_coef = 0.0;
  Harness h0(m);
  const double ce = h0.loss();
  // With perfectly uniform routing the HF aux loss is k (= 2): E * sum_e (k/E) * (1/E). Real routing of a
  // random model sits near that value.
  const double aux = total - ce;
  EXPECT_GT(aux, 1.5);
  EXPECT_LT(aux, 3.5);
}

}  // namespace
}  // namespace mxt
