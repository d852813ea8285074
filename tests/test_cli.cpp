// Command-line parsing: options, overrides, help/version/usage errors as exit codes, and the parsed
// options driving resolve_config.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <regex>

#include "mxtrain/cli.hpp"
#include "mxtrain/version.hpp"

#ifndef MXTRAIN_SOURCE_DIR
#define MXTRAIN_SOURCE_DIR "/work/main"
#endif

using ::testing::HasSubstr;

namespace mxt {
namespace {

CliOptions parse(const std::vector<std::string>& args) {
  std::vector<const char*> argv{"mxtrain"};
  for (const auto& a : args) argv.push_back(a.c_str());
  return parse_cli(static_cast<int>(argv.size()), argv.data());
}

TEST(Cli, Defaults) {
  const CliOptions o = parse({});
  EXPECT_EQ(o.load.config_name, "L0_sanity");
  EXPECT_EQ(o.load.config_path, "");
  EXPECT_TRUE(o.load.overrides.empty());
  EXPECT_FALSE(o.print_config || o.dry_run || o.show_version || o.should_exit);
}

TEST(Cli, TheRecipeCommandLine) {
  const CliOptions o = parse({"--config-name", "L1_8x7B_ep", "checkpoint.ckpt_dir=/path/to/ckpt"});
  EXPECT_FALSE(o.should_exit);
  EXPECT_EQ(o.load.config_name, "L1_8x7B_ep");
  EXPECT_EQ(o.load.overrides, std::vector<std::string>{"checkpoint.ckpt_dir=/path/to/ckpt"});
}

TEST(Cli, OverridesKeepTheirOrderAroundOptions) {
  const CliOptions o = parse({"a=1", "--dry-run", "+b.c=[1,2]", "--config-name=L0_sanity", "~d", "++e=x"});
  EXPECT_FALSE(o.should_exit);
  EXPECT_TRUE(o.dry_run);
  EXPECT_EQ(o.load.overrides, (std::vector<std::string>{"a=1", "+b.c=[1,2]", "~d", "++e=x"}));
}

TEST(Cli, ConfigPathAndPrintConfig) {
  const CliOptions o = parse({"--config-path", "/some/dir", "--cfg", "job"});
  EXPECT_EQ(o.load.config_path, "/some/dir");
  EXPECT_TRUE(o.print_config);
  EXPECT_TRUE(parse({"-c", "job"}).print_config);
}

TEST(Cli, HelpExitsZeroWithUsage) {
  for (const char* flag : {"--help", "-h"}) {
    const CliOptions o = parse({flag});
    EXPECT_TRUE(o.should_exit);
    EXPECT_EQ(o.exit_code, 0);
    EXPECT_THAT(o.message, HasSubstr("--config-name"));
    EXPECT_THAT(o.message, HasSubstr("+key=value"));
  }
}

TEST(Cli, VersionExitsZero) {
  const CliOptions o = parse({"--version"});
  EXPECT_TRUE(o.should_exit && o.show_version);
  EXPECT_EQ(o.exit_code, 0);
  EXPECT_EQ(o.message, "mxtrain " MXTRAIN_VERSION " (commit " + std::string(build_commit()) + ")\n");
}

// The commit recorded at build time: 12 hex digits (+ "-dirty"), or "unknown" outside a git checkout.
TEST(Cli, VersionNamesTheBuildCommit) {
  const std::string c = build_commit();
  EXPECT_TRUE(c == "unknown" || std::regex_match(c, std::regex("[0-9a-f]{12}(-dirty)?"))) << c;
  EXPECT_THAT(version_string(), HasSubstr(c));
}

TEST(Cli, UsageErrorsExitTwoNamingTheProblem) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--bogus"}, "--bogus"},
      {{"--config-name"}, "--config-name"},
      {{"--cfg", "hydra"}, "hydra"},
  };
  for (const auto& [args, expected] : cases) {
    SCOPED_TRACE(args[0]);
    const CliOptions o = parse(args);
    EXPECT_TRUE(o.should_exit);
    EXPECT_EQ(o.exit_code, 2);
    EXPECT_THAT(o.message, HasSubstr(expected));
  }
}

TEST(Cli, TakesMainsArgv) {
  std::string prog = "mxtrain", flag = "--dry-run";
  char* argv[] = {prog.data(), flag.data(), nullptr};
  EXPECT_TRUE(parse_cli(2, argv).dry_run);
}

TEST(Cli, ParsedOptionsResolve) {
  // Built-in configs.
  CliOptions o = parse({"--config-name", "L1_8x7B_ep", "num_train_steps=3", "adamw_kwargs.betas=[0.9,0.99]"});
  TrainConfig c = to_train_config(resolve_config(o.load));
  EXPECT_EQ(c.num_train_steps, 3);
  EXPECT_DOUBLE_EQ(c.adamw.beta2, 0.99);
  EXPECT_EQ(c.parallelism.ep_size, 8);
  // The source tree's configs through --config-path.
  o = parse({"--config-path", MXTRAIN_SOURCE_DIR "/configs", "parallelism.ep_size=1"});
  c = to_train_config(resolve_config(o.load));
  EXPECT_EQ(c.model.hidden_size, 256);
  EXPECT_NO_THROW(validate_for_run(c, 1));
}

}  // namespace
}  // namespace mxt
