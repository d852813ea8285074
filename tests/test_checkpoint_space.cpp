// Checkpoint disk space: checkpoint_bytes against the bytes a save really writes, and the start-up checks that
// stop a run whose first save cannot fit (or whose directories cannot be written) and warn when a later one may
// not fit.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "cpu/cpu_ops.hpp"
#include "mxtrain/checkpoint.hpp"
#include "mxtrain/data.hpp"
#include "mxtrain/trainer.hpp"
#include "mxtrain/writable_dir.hpp"
#include "tiny_config.hpp"

namespace mxt {
namespace {

namespace fs = std::filesystem;

TEST(CheckpointSpace, BytesMatchWhatASaveWrites) {
  TrainConfig c = testing::tiny_config("mxtrain_test_ckpt_space");
  const fs::path root = fs::temp_directory_path() / "mxtrain_test_ckpt_space";
  fs::remove_all(root);
  c.output_dir = (root / "out").string();
  c.checkpoint.ckpt_dir = (root / "ckpt").string();
  c.checkpoint.save_every_n_steps = 1;
  c.num_train_steps = 1;
  auto ops = make_cpu_ops();
  Trainer t(c, *ops, embedded_corpus_tokens());
  t.run();
  int64_t written = 0;
  for (const auto& e : fs::recursive_directory_iterator(root / "ckpt" / "step_1"))
    if (e.is_regular_file()) written += static_cast<int64_t>(e.file_size());
  const int64_t planned = checkpoint_bytes(c.model);
  EXPECT_GE(written, planned);
  EXPECT_LT(written - planned, 64 * 1024) << "headers, manifest and loader state only";  // a few KB
  fs::remove_all(root);
}

TEST(CheckpointSpace, FirstSaveThatCannotFitIsAnErrorNamingTheKey) {
  CheckpointConfig c;
  c.ckpt_dir = "/some/where";
  c.max_checkpoints = 3;
  const CheckpointSpace s = check_checkpoint_space(c, 570'000'000'000, 0, 2, 235'000'000'000);
  EXPECT_NE(s.error.find("checkpoint.ckpt_dir=/some/where"), std::string::npos) << s.error;
  EXPECT_NE(s.error.find("570.0 GB"), std::string::npos) << s.error;
  EXPECT_NE(s.error.find("235.0 GB free"), std::string::npos) << s.error;
}

TEST(CheckpointSpace, RetentionThatMayNotFitIsAWarning) {
  CheckpointConfig c;
  c.ckpt_dir = "/some/where";
  c.max_checkpoints = 3;  // up to 4 on disk while the newest is written
  const int64_t gb = 1'000'000'000;
  CheckpointSpace s = check_checkpoint_space(c, 10 * gb, 0, 100, 35 * gb);
  EXPECT_TRUE(s.error.empty());
  EXPECT_NE(s.warning.find("may add 4"), std::string::npos) << s.warning;
  s = check_checkpoint_space(c, 10 * gb, 0, 100, 40 * gb);  // room for all 4
  EXPECT_TRUE(s.warning.empty()) << s.warning;
  s = check_checkpoint_space(c, 10 * gb, 2, 100, 25 * gb);  // 2 there already: 2 more at the most
  EXPECT_TRUE(s.warning.empty()) << s.warning;
  s = check_checkpoint_space(c, 10 * gb, 0, 2, 25 * gb);  // only 2 saves in this run
  EXPECT_TRUE(s.warning.empty()) << s.warning;
  c.max_checkpoints = 0;  // keep all: every save of the run stays
  s = check_checkpoint_space(c, 10 * gb, 1, 5, 45 * gb);
  EXPECT_NE(s.warning.find("may add 5"), std::string::npos) << s.warning;
  c.ckpt_dir.clear();  // no checkpoints, nothing to check
  s = check_checkpoint_space(c, 10 * gb, 0, 5, 0);
  EXPECT_TRUE(s.error.empty() && s.warning.empty());
}

TEST(CheckpointSpace, AsksTheFilesystemOfTheNearestExistingParent) {
  CheckpointConfig c;
  c.ckpt_dir = (fs::temp_directory_path() / "mxtrain_no_such_dir" / "a" / "b").string();
  // More than any disk here: an error from the real free space of the temp directory's filesystem.
  const CheckpointSpace s = check_checkpoint_space(c, int64_t(1) << 60, 0, 1);
  EXPECT_NE(s.error.find("GB free"), std::string::npos) << s.error;
  EXPECT_TRUE(check_checkpoint_space(c, 1024, 0, 1).error.empty());
}

TEST(WritableDir, DirectoryThatCannotBeMadeOrWrittenIsNamed) {
  const fs::path root = fs::temp_directory_path() / "mxtrain_test_ckpt_dir";
  fs::remove_all(root);
  fs::create_directories(root);
  std::ofstream(root / "a_file") << "x";
  const std::string under_file = (root / "a_file" / "ckpt").string();
  const std::string err = writable_dir_problem("checkpoint.ckpt_dir", under_file);
  EXPECT_NE(err.find("checkpoint.ckpt_dir=" + under_file + ": cannot create it"), std::string::npos) << err;
  const std::string fine = (root / "new" / "ckpt").string();
  EXPECT_EQ(writable_dir_problem("output_dir", fine), "");
  EXPECT_TRUE(fs::is_directory(fine));
  EXPECT_TRUE(fs::is_empty(fine));  // the probe file is gone
  fs::remove_all(root);
}

}  // namespace
}  // namespace mxt
