// The data pipeline through the executable: `mxtrain preprocess` (progress, errors, exit codes) and training
// on its indexed dataset with sequence packing, gzip FASTQ, and blended sources.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "binary_test_util.hpp"
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "data_test_util.hpp"
#include "mxtrain/cli.hpp"

namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

using mxt::testing::RunResult;
RunResult run(const std::string& args) { return mxt::testing::run_mxtrain(args); }

const char* kTiny =
    "parallelism.ep_size=1 backend=cpu config_kwargs.vocab_size=256 config_kwargs.hidden_size=32 "
    "config_kwargs.intermediate_size=48 config_kwargs.num_attention_heads=4 config_kwargs.num_key_value_heads=2 "
    "dataset.max_seq_length=32 dataset.stride=8 lr_scheduler_kwargs.num_warmup_steps=2 "
    "lr_scheduler_kwargs.num_decay_steps=10 num_train_steps=8 dataset.tokenizer=nucleotide ";

std::string genome(int records, std::mt19937& rng) {
  std::string s;
  for (int r = 0; r < records; ++r) {
    s += ">contig" + std::to_string(r) + "\n";
    const int len = 20 + static_cast<int>(rng() % 120);
    for (int i = 0; i < len; ++i) s += "ACGT"[rng() % 4];
    s += "\n";
  }
  return s;
}

}  // namespace

TEST(DataBinary, PreprocessThenTrainPacked) {
  dtest::TempDir d;
  std::mt19937 rng(3);
  const std::string fa = d.write_gz("g.fa.gz", genome(60, rng));
  const RunResult p = run("preprocess --input " + fa + " --output-prefix " + d.path("ds/g") + " --progress-interval 0");
  ASSERT_EQ(p.exit_code, 0) << p.output;
  EXPECT_THAT(p.output, HasSubstr("preprocess: file 1/1"));
  EXPECT_THAT(p.output, HasSubstr("60 sequences"));
  ASSERT_TRUE(fs::exists(d.path("ds/g.idx")));
  const RunResult t = run(std::string(kTiny) + "use_sequence_packing=true dataset.source=mmidx dataset.paths=[" +
                          d.path("ds/g") + "] output_dir=" + d.path("out"));
  ASSERT_EQ(t.exit_code, 0) << t.output;
  EXPECT_THAT(t.output, HasSubstr("packed"));
  EXPECT_THAT(t.output, HasSubstr("step 8/8"));
}

TEST(DataBinary, BlendedFastqGzAndFasta) {
  dtest::TempDir d;
  std::mt19937 rng(4);
  std::string fq;
  for (int r = 0; r < 80; ++r) {
    std::string s(50, 'A');
    for (char& c : s) c = "ACGT"[rng() % 4];
    fq += "@r" + std::to_string(r) + "\n" + s + "\n+\n" + std::string(50, 'I') + "\n";
  }
  const std::string a = d.write_gz("reads.fq.gz", fq), b = d.write("g.fa", genome(40, rng));
  const RunResult t = run(std::string(kTiny) + "dataset.source=auto dataset.paths=[" + a + "," + b +
                          "] dataset.weights=[0.3,0.7] dataset.reverse_complement_prob=0.5 output_dir=" +
                          d.path("out"));
  ASSERT_EQ(t.exit_code, 0) << t.output;
  EXPECT_THAT(t.output, HasSubstr("weight 0.3"));
  EXPECT_THAT(t.output, HasSubstr("step 8/8"));
}

TEST(DataBinary, BadDataExitsWithItsMessage) {
  dtest::TempDir d;
  const std::string bad = d.write("bad.fa", ">ok\nACGT\n>broken read\nACJT\n");
  RunResult r = run("preprocess --input " + bad + " --output-prefix " + d.path("x"));
  EXPECT_EQ(r.exit_code, 3) << r.output;  // a data error
  EXPECT_THAT(r.output, HasSubstr("record 2 (>broken read), line 4, column 3: invalid character 'J'"));
  r = run("preprocess --input " + bad + " --output-prefix " + d.path("x") + " --skip-bad-records");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("1 malformed records left out"));
  r = run("preprocess --output-prefix " + d.path("x"));
  EXPECT_EQ(r.exit_code, 2) << r.output;  // usage
  EXPECT_THAT(r.output, HasSubstr("--input"));
  d.write("t.idx", std::string("MMIDIDX\0\0\1", 10));  // the magic, then the header cut short
  d.write("t.bin", "");
  r = run(std::string(kTiny) + "dataset.source=mmidx dataset.paths=[" + d.path("t") + "] output_dir=" + d.path("o"));
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_THAT(r.output, HasSubstr(d.path("t.idx")));
  r = run(std::string(kTiny) + "dataset.source=fasta dataset.paths=[" + bad + "] dataset.skip_bad_records=true " +
          "output_dir=" + d.path("o"));
  EXPECT_NE(r.exit_code, 0);  // one good record of 5 tokens is less than one window...
  EXPECT_THAT(r.output, HasSubstr("skipped 1 malformed record(s)"));  // ...but the skip was reported first
}

TEST(DataBinary, PreprocessCommandLine) {
  const char* argv[] = {"mxtrain", "preprocess", "-i", "a.fa", "--input", "b*.fq.gz", "-o", "out/p", "--tokenizer",
                        "protein", "--keep-case", "--bos-token-id", "0", "--eos-token-id", "2", "--skip-bad-records"};
  const mxt::CliOptions o = mxt::parse_cli(16, argv);
  ASSERT_FALSE(o.should_exit) << o.message;
  EXPECT_TRUE(o.preprocess);
  const mxt::PreprocessOptions& p = o.preprocess_options;
  EXPECT_EQ(p.inputs, (std::vector<std::string>{"a.fa", "b*.fq.gz"}));
  EXPECT_EQ(p.output_prefix, "out/p");
  EXPECT_EQ(p.tokenizer, "protein");
  EXPECT_FALSE(p.uppercase);
  EXPECT_EQ(p.bos_token_id, 0);
  EXPECT_EQ(p.eos_token_id, 2);
  EXPECT_TRUE(p.skip_bad_records);
  const char* train[] = {"mxtrain", "--config-name", "L0_sanity", "use_sequence_packing=true"};
  const mxt::CliOptions t = mxt::parse_cli(4, train);
  EXPECT_FALSE(t.preprocess);
  EXPECT_EQ(t.load.overrides, (std::vector<std::string>{"use_sequence_packing=true"}));
}
