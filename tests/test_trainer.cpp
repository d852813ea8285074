// Trainer: the LR schedule, loss falling on the embedded corpus, identical losses for identical seeds.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "mxtrain/data.hpp"
#include "tiny_config.hpp"
#include "mxtrain/lr_schedule.hpp"
#include "mxtrain/trainer.hpp"

namespace mxt {
namespace {

TEST(LrSchedule, WarmupCosineThenFloor) {
  AdamWConfig o;
  o.lr = 1e-3;
  LRSchedulerConfig s{10, 100, 0.1};
  EXPECT_DOUBLE_EQ(lr_at_step(o, s, 0), 0.0);
  EXPECT_DOUBLE_EQ(lr_at_step(o, s, 5), 0.5e-3);
  EXPECT_DOUBLE_EQ(lr_at_step(o, s, 10), 1e-3);
  EXPECT_NEAR(lr_at_step(o, s, 60), 1e-3 * (0.1 + 0.9 * 0.5), 1e-12);  // half-way: cos = 0
  EXPECT_NEAR(lr_at_step(o, s, 110), 1e-4, 1e-12);
  EXPECT_NEAR(lr_at_step(o, s, 500), 1e-4, 1e-12);
  EXPECT_LT(lr_at_step(o, s, 40), lr_at_step(o, s, 30));  // decreasing during decay
}

TrainConfig tiny_train_config() { return testing::tiny_config("mxtrain_test_trainer"); }

TEST(Trainer, LossFallsOnEmbeddedCorpus) {
  const TrainConfig c = tiny_train_config();
  auto ops = make_cpu_ops();
  Trainer t(c, *ops, embedded_corpus_tokens());
  const std::vector<double> losses = t.run();
  ASSERT_EQ(losses.size(), 30u);
  EXPECT_NEAR(losses.front(), std::log(256.0), 0.3);  // random init: near-uniform prediction
  EXPECT_LT(losses.back(), losses.front() - 1.5) << "first " << losses.front() << " last " << losses.back();
}

TEST(Trainer, SameSeedSameLosses) {
  TrainConfig c = tiny_train_config();
  c.num_train_steps = 5;
  c.model.router_jitter_noise = 0.05;
  c.model.router_aux_loss_coef = 0.01;
  auto ops = make_cpu_ops();
  std::vector<double> a, b, other;
  {
    Trainer t(c, *ops, embedded_corpus_tokens());
    a = t.run();
  }
  {
    Trainer t(c, *ops, embedded_corpus_tokens());
    b = t.run();
  }
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "step " << i;  // bit for bit
  c.seed = 43;
  Trainer t(c, *ops, embedded_corpus_tokens());
  other = t.run();
  EXPECT_NE(a.back(), other.back());
}

TEST(Trainer, GradientClippingScalesTheUpdate) {
  // With Adam's eps much larger than the gradient, the first update is lr * clipped_grad / eps, so the size
  // of the parameter change measures the clipped gradient norm directly.
  TrainConfig c = tiny_train_config();
  c.max_grad_norm = 1e-3;
  c.adamw = {1.0, 0.9, 0.95, 1.0, 0.0};  // lr 1, eps 1, no weight decay
  c.lr_scheduler = {0, 0, 1.0};
  auto ops = make_cpu_ops();
  Trainer t(c, *ops, embedded_corpus_tokens());
  auto snapshot = [&] {
    std::vector<float> w;
    for (FlatParams* fp : {&t.dense(), &t.expert()})
      w.insert(w.end(), fp->master.f32(), fp->master.f32() + fp->master.numel());
    return w;
  };
  const std::vector<float> before = snapshot();
  const StepResult r = t.train_step();
  const std::vector<float> after = snapshot();
  double delta_sq = 0;
  for (size_t i = 0; i < before.size(); ++i) delta_sq += double(after[i] - before[i]) * (after[i] - before[i]);
  EXPECT_GT(r.grad_norm, 0.1);  // well above the clip threshold
  // m_hat = g_clipped, sqrt(v_hat) = |g_clipped| << eps: delta = g_clipped / (|g_clipped| + 1) elementwise.
  EXPECT_NEAR(std::sqrt(delta_sq), 1e-3, 2e-5);
}

}  // namespace
}  // namespace mxt
