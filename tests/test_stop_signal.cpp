// Graceful stop (stop_signal.hpp): the handler's rules (a second SIGTERM / SIGINT stops at once, SIGUSR1 never
// does), and the trainer ending after the step in which a signal arrived, with a checkpoint of that step. The
// process-level behaviour (exit status 75, resume, mpirun) is tests/stop_signal.sh.
#include <gtest/gtest.h>

#include <csignal>
#include <filesystem>
#include <unistd.h>

#include "cpu/cpu_ops.hpp"
#include "mxtrain/checkpoint.hpp"
#include "mxtrain/data.hpp"
#include "mxtrain/stop_signal.hpp"
#include "mxtrain/trainer.hpp"
#include "tiny_config.hpp"

namespace mxt {
namespace {

namespace fs = std::filesystem;

// The test binary's own handlers back to the defaults, so the tests after these are not affected.
struct DefaultHandlersAfter {
  ~DefaultHandlersAfter() {
    for (int sig : stop_signals()) std::signal(sig, SIG_DFL);
    clear_stop_signal();
  }
};

TEST(StopSignalDeathTest, SecondTermStopsAtOnce) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        install_stop_handlers();
        raise(SIGTERM);
        if (stop_signal() != SIGTERM) _exit(3);  // the first one only asks
        raise(SIGTERM);
        _exit(4);
      },
      ::testing::KilledBySignal(SIGTERM), "stop requested");
}

TEST(StopSignalDeathTest, SecondIntStopsAtOnce) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        install_stop_handlers();
        raise(SIGINT);
        raise(SIGINT);
        _exit(4);
      },
      ::testing::KilledBySignal(SIGINT), "stop requested");
}

TEST(StopSignalDeathTest, UsrOneOnlyAsksAndTheFirstSignalIsKept) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        install_stop_handlers();
        raise(SIGUSR1);
        raise(SIGUSR1);
        _exit(stop_signal() == SIGUSR1 ? 0 : 5);
      },
      ::testing::ExitedWithCode(0), "stop requested");
}

TEST(StopSignal, TrainerEndsTheStepSavesAndStops) {
  DefaultHandlersAfter restore;
  TrainConfig c = testing::tiny_config("mxtrain_test_stop_signal");
  const fs::path root = fs::temp_directory_path() / "mxtrain_test_stop_signal";
  fs::remove_all(root);
  c.output_dir = (root / "out").string();
  c.checkpoint.ckpt_dir = (root / "ckpt").string();
  c.checkpoint.save_every_n_steps = 10;
  c.checkpoint.save_final_model = true;  // not written by a stopped run
  c.num_train_steps = 30;
  auto ops = make_cpu_ops();
  Trainer t(c, *ops, embedded_corpus_tokens());
  install_stop_handlers();
  raise(SIGUSR1);  // before the first step's loss reduction: the run ends after step 1
  const std::vector<double> losses = t.run();
  EXPECT_TRUE(t.stopped_early());
  EXPECT_EQ(losses.size(), 1u);
  const auto found = find_checkpoints(c.checkpoint.ckpt_dir);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].first, 1);
  EXPECT_FALSE(fs::exists(root / "ckpt" / "final_model"));

  // The same run, not signalled: 30 steps, the final model, and step 1's loss bit for bit.
  clear_stop_signal();
  fs::remove_all(root);
  Trainer straight(c, *ops, embedded_corpus_tokens());
  const std::vector<double> all = straight.run();
  EXPECT_FALSE(straight.stopped_early());
  ASSERT_EQ(all.size(), 30u);
  EXPECT_EQ(all[0], losses[0]);
  EXPECT_TRUE(fs::exists(root / "ckpt" / "final_model"));
  fs::remove_all(root);
}

}  // namespace
}  // namespace mxt
