// Data inputs: FASTA and token-file readers, load_tokens' checks, the embedded corpus, and BatchLoader's
// windows, shuffle, sharding and resume. Every input file is written by the test into its own temp dir.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "data_test_util.hpp"
#include "mxtrain/data.hpp"

namespace fs = std::filesystem;
using mxt::BatchLoader;
using mxt::DataError;
using mxt::DatasetConfig;

namespace {

using dtest::bytes_of;
using dtest::data_error;
using dtest::TempDir;

std::string le16(std::initializer_list<uint32_t> v) {
  std::string s;
  for (uint32_t x : v) s += {char(x & 0xff), char(x >> 8 & 0xff)};
  return s;
}
std::string le32(std::initializer_list<uint32_t> v) {
  std::string s;
  for (uint32_t x : v) s += {char(x & 0xff), char(x >> 8 & 0xff), char(x >> 16 & 0xff), char(x >> 24 & 0xff)};
  return s;
}

uint64_t fnv1a(const std::vector<int32_t>& t) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (int32_t x : t) h = (h ^ static_cast<uint32_t>(x)) * 0x100000001b3ull;
  return h;
}

}  // namespace

// ---------------------------------------------------------------- FASTA

TEST(FastaReader, MultiLineLowercaseCrlfAndEos) {
  TempDir d;
  const auto p = d.write("a.fa", ">seq1 some description\r\nACgt\r\nnn\r\n>prot\r\nMkV*\r\n");
  std::vector<int32_t> want = bytes_of("ACGTNN");
  want.push_back(7);
  for (int32_t c : bytes_of("MKV*")) want.push_back(c);
  want.push_back(7);
  EXPECT_EQ(mxt::read_fasta_tokens(p, 7), want);
}

TEST(FastaReader, EmptyRecordBlankLinesWhitespaceAndGaps) {
  TempDir d;
  // An empty record adds no eos; blank lines, inner spaces/tabs are ignored; '-' is kept; no final newline.
  const auto p = d.write("b.fa", "\n>a\nA C\tG\n\n>empty\n>b\n  --t\n>c\nAC");
  std::vector<int32_t> want = bytes_of("ACG");
  want.push_back(0);
  for (int32_t c : bytes_of("--T")) want.push_back(c);
  want.push_back(0);
  for (int32_t c : bytes_of("AC")) want.push_back(c);
  want.push_back(0);
  EXPECT_EQ(mxt::read_fasta_tokens(p, 0), want);
}

TEST(FastaReader, MissingFileNamesPath) {
  TempDir d;
  const auto p = d.path("nope.fa");
  const auto msg = data_error([&] { mxt::read_fasta_tokens(p, 0); });
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
  EXPECT_NE(msg.find("does not exist"), std::string::npos) << msg;
}

TEST(FastaReader, InvalidCharacterNamesRecordAndLine) {
  TempDir d;
  const auto p = d.write("bad.fa", ">r1\nACGT\n>r2 second\nAC1T\n");
  const auto msg = data_error([&] { mxt::read_fasta_tokens(p, 0); });
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
  EXPECT_NE(msg.find("record 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find(">r2 second"), std::string::npos) << msg;
  EXPECT_NE(msg.find("line 4"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'1'"), std::string::npos) << msg;
}

TEST(FastaReader, NonAsciiByteRejected) {
  TempDir d;
  const auto p = d.write("u.fa", ">r1\nAC\xc3\xa9\n");
  const auto msg = data_error([&] { mxt::read_fasta_tokens(p, 0); });
  EXPECT_NE(msg.find("0xC3"), std::string::npos) << msg;
}

TEST(FastaReader, SequenceBeforeHeader) {
  TempDir d;
  const auto p = d.write("nohdr.fa", "\nACGT\n>r1\nAC\n");
  const auto msg = data_error([&] { mxt::read_fasta_tokens(p, 0); });
  EXPECT_NE(msg.find("line 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("before the first"), std::string::npos) << msg;
}

TEST(FastaReader, EmptyFileAndHeadersOnly) {
  TempDir d;
  const auto e = d.write("empty.fa", "");
  EXPECT_NE(data_error([&] { mxt::read_fasta_tokens(e, 0); }).find("empty"), std::string::npos);
  const auto w = d.write("blank.fa", "\n  \r\n");
  EXPECT_NE(data_error([&] { mxt::read_fasta_tokens(w, 0); }).find("empty"), std::string::npos);
  const auto h = d.write("hdrs.fa", ">a\n>b\n");
  EXPECT_NE(data_error([&] { mxt::read_fasta_tokens(h, 0); }).find("no sequence data"), std::string::npos);
}

// ---------------------------------------------------------------- token files

TEST(TokenFile, Uint16LittleEndian) {
  TempDir d;
  const auto p = d.write("t.u16", le16({1, 65535, 0x1234, 0}));
  EXPECT_EQ(mxt::read_token_file(p, "uint16"), (std::vector<int32_t>{1, 65535, 0x1234, 0}));
}

TEST(TokenFile, Uint32LittleEndian) {
  TempDir d;
  const auto p = d.write("t.u32", le32({70000, 1, 0x01020304}));
  EXPECT_EQ(mxt::read_token_file(p, "uint32"), (std::vector<int32_t>{70000, 1, 0x01020304}));
  const auto big = d.write("big.u32", le32({5, 0x80000000u}));
  const auto msg = data_error([&] { mxt::read_token_file(big, "uint32"); });
  EXPECT_NE(msg.find("token offset 1"), std::string::npos) << msg;
}

TEST(TokenFile, BadSizeNamesFileAndSize) {
  TempDir d;
  const auto p = d.write("odd.u16", std::string(5, '\1'));
  auto msg = data_error([&] { mxt::read_token_file(p, "uint16"); });
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
  EXPECT_NE(msg.find("size 5"), std::string::npos) << msg;
  const auto q = d.write("six.u32", std::string(6, '\1'));
  msg = data_error([&] { mxt::read_token_file(q, "uint32"); });
  EXPECT_NE(msg.find("size 6"), std::string::npos) << msg;
  EXPECT_EQ(mxt::read_token_file(q, "uint16").size(), 3u);  // the same bytes are fine as uint16
}

TEST(TokenFile, EmptyMissingAndUnknownDtype) {
  TempDir d;
  const auto e = d.write("e.u16", "");
  EXPECT_NE(data_error([&] { mxt::read_token_file(e, "uint16"); }).find("empty"), std::string::npos);
  const auto m = d.path("missing.u16");
  EXPECT_NE(data_error([&] { mxt::read_token_file(m, "uint16"); }).find(m), std::string::npos);
  const auto p = d.write("ok.u16", le16({1}));
  EXPECT_NE(data_error([&] { mxt::read_token_file(p, "int8"); }).find("'int8'"), std::string::npos);
}

// ---------------------------------------------------------------- load_tokens

TEST(LoadTokens, VocabCheckNamesFileOffsetValue) {
  TempDir d;
  const auto ok = d.write("ok.u16", le16({1, 2, 3, 4}));
  const auto bad = d.write("bad.u16", le16({1, 2, 300, 4}));
  DatasetConfig cfg;
  cfg.source = "tokens";
  cfg.max_seq_length = 3;
  cfg.paths = {ok, bad};
  const auto msg = data_error([&] { mxt::load_tokens(cfg, 256); });
  EXPECT_NE(msg.find(bad), std::string::npos) << msg;
  EXPECT_NE(msg.find("offset 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("300"), std::string::npos) << msg;
  EXPECT_EQ(mxt::load_tokens(cfg, 301).size(), 8u);  // the same data fits a larger vocabulary
}

TEST(LoadTokens, ConcatenatesFastaFilesInOrder) {
  TempDir d;
  const auto a = d.write("a.fa", ">a\nAC\n");
  const auto b = d.write("b.fa", ">b\nGT\n");
  DatasetConfig cfg;
  cfg.source = "fasta";
  cfg.max_seq_length = 4;
  cfg.eos_token_id = 1;
  cfg.paths = {b, a};
  EXPECT_EQ(mxt::load_tokens(cfg, 256), (std::vector<int32_t>{'G', 'T', 1, 'A', 'C', 1}));
  cfg.eos_token_id = 256;  // eos outside the vocabulary is caught by the vocab check
  EXPECT_NE(data_error([&] { mxt::load_tokens(cfg, 256); }).find("256"), std::string::npos);
}

TEST(LoadTokens, NeedsOneFullWindow) {
  TempDir d;
  std::vector<uint32_t> v(129, 5);
  std::string bytes;
  for (uint32_t x : v) bytes += le16({x});
  const auto p = d.write("t.u16", bytes);
  DatasetConfig cfg;
  cfg.source = "tokens";
  cfg.paths = {p};
  cfg.max_seq_length = 129;
  EXPECT_EQ(mxt::load_tokens(cfg, 16).size(), 129u);
  cfg.max_seq_length = 130;
  EXPECT_NE(data_error([&] { mxt::load_tokens(cfg, 16); }).find("129 tokens"), std::string::npos);
}

TEST(LoadTokens, SourcesAndPathsChecked) {
  DatasetConfig cfg;
  cfg.source = "parquet";
  EXPECT_NE(data_error([&] { mxt::load_tokens(cfg, 256); }).find("parquet"), std::string::npos);
  cfg.source = "fasta";
  EXPECT_NE(data_error([&] { mxt::load_tokens(cfg, 256); }).find("dataset.paths"), std::string::npos);
  cfg.source = "embedded";
  EXPECT_EQ(mxt::load_tokens(cfg, 256), mxt::embedded_corpus_tokens());
  // 'T' (84) is outside a 64-token vocabulary.
  EXPECT_NE(data_error([&] { mxt::load_tokens(cfg, 64); }).find("embedded corpus"), std::string::npos);
}

// ---------------------------------------------------------------- embedded corpus

TEST(EmbeddedCorpus, DeterministicSizeAndContent) {
  const auto a = mxt::embedded_corpus_tokens();
  const auto b = mxt::embedded_corpus_tokens();
  EXPECT_EQ(fnv1a(a), fnv1a(b));
  EXPECT_EQ(a, b);
  EXPECT_GE(a.size(), 200000u);
  EXPECT_LE(a.size(), 400000u);
  const std::string text(a.begin(), a.end());
  EXPECT_EQ(text.rfind(">gene_1\n", 0), 0u);
  for (const char* motif : {"ATG", "TTGACA", "TATAAT", "AGGAGG", "TTTTTTT", "\n>gene_100\n"})
    EXPECT_NE(text.find(motif), std::string::npos) << motif;
  // Only sequence bases, newlines and header characters; no line longer than 60 columns.
  const std::string allowed = "ACGT\n>gene_0123456789";
  size_t col = 0, longest = 0;
  for (char c : text) {
    ASSERT_NE(allowed.find(c), std::string::npos) << int(c);
    col = c == '\n' ? 0 : col + 1;
    longest = std::max(longest, col);
  }
  EXPECT_LE(longest, 60u);
  EXPECT_EQ(text.back(), '\n');
}

TEST(EmbeddedCorpus, NonTrivialComposition) {
  const auto t = mxt::embedded_corpus_tokens();
  std::map<int32_t, size_t> count;
  for (int32_t x : t) ++count[x];
  for (char base : std::string("ACGT")) EXPECT_GT(count[base], t.size() / 8) << base;  // all four bases common
  const size_t records = count['>'];
  EXPECT_GT(records, 200u);
  EXPECT_LT(records, 600u);
  // Codon usage is skewed: CTG (the favourite leucine codon) is far more common than CTA.
  const std::string text(t.begin(), t.end());
  auto occurrences = [&](const std::string& s) {
    size_t n = 0;
    for (size_t p = text.find(s); p != std::string::npos; p = text.find(s, p + 1)) ++n;
    return n;
  };
  EXPECT_GT(occurrences("CTG"), 2 * occurrences("CTA"));
}

TEST(EmbeddedCorpus, PinnedChecksumAcrossPlatforms) {
  // The corpus must be byte-identical on every machine and build; if the generator is changed on purpose,
  // update these two numbers in the same change.
  const auto t = mxt::embedded_corpus_tokens();
  EXPECT_EQ(t.size(), 300439u);
  EXPECT_EQ(fnv1a(t), 12612946667111113773ull);
}

// dataset.source=random: uniform ids in [0, vocab), the same stream on every run, as many tokens as documented.
TEST(RandomCorpus, UniformInRangeAndRepeatable) {
  const int64_t vocab = 1000;
  const auto a = mxt::random_tokens(200000, vocab), b = mxt::random_tokens(200000, vocab);
  EXPECT_EQ(a, b);
  std::vector<int64_t> count(10, 0);
  for (int32_t v : a) {
    ASSERT_GE(v, 0);
    ASSERT_LT(v, vocab);
    ++count[v / 100];
  }
  for (int64_t c : count) EXPECT_NEAR(c, 20000, 600);  // 10 buckets of 20,000 expected; sd ~134
  std::set<int32_t> distinct(a.begin(), a.end());
  EXPECT_EQ(distinct.size(), static_cast<size_t>(vocab));  // 200 draws per id on average: all occur
  const auto prefix = mxt::random_tokens(10, vocab);       // a prefix of the longer stream
  EXPECT_TRUE(std::equal(prefix.begin(), prefix.end(), a.begin()));

  DatasetConfig c;
  c.max_seq_length = 128;
  c.source = "random";
  const mxt::Corpus corpus = mxt::open_corpus(c, 128256);
  EXPECT_EQ(corpus.num_tokens(), mxt::kRandomCorpusTokens);
  BatchLoader l(corpus, c, 7, 0, 1);
  mxt::Batch batch;
  l.next(batch);
  EXPECT_TRUE(std::all_of(batch.input_ids.begin(), batch.input_ids.end(), [](int32_t v) { return v < 128256; }));
  EXPECT_GT(*std::max_element(batch.input_ids.begin(), batch.input_ids.end()), 255);  // not bytes
}

// ---------------------------------------------------------------- BatchLoader

namespace {

DatasetConfig loader_cfg(int64_t seq, int64_t stride, int64_t mbs, bool shuffle) {
  DatasetConfig c;
  c.max_seq_length = seq;
  c.stride = stride;
  c.micro_batch_size = mbs;
  c.shuffle = shuffle;
  return c;
}

std::vector<int32_t> iota_tokens(int n) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), 0);
  return t;
}

// Start offset of each row of the next `rows` single-row batches (tokens are 0..N-1, so input_ids[0] is it).
std::vector<int32_t> next_starts(BatchLoader& l, int rows) {
  std::vector<int32_t> s;
  mxt::Batch b;
  for (int i = 0; i < rows; ++i) {
    l.next(b);
    for (int64_t r = 0; r < b.batch; ++r) s.push_back(b.input_ids[r * b.seq]);
  }
  return s;
}

}  // namespace

TEST(BatchLoaderTest, StrideStartsLabelsAndPositions) {
  // S=8, stride 3 -> step 5; 30 tokens give windows at 0,5,10,15,20 (25..32 would run past the end).
  BatchLoader l(iota_tokens(30), loader_cfg(8, 3, 1, false), 1, 0, 1);
  EXPECT_EQ(l.num_windows(), 5);
  mxt::Batch b;
  for (int32_t start : {0, 5, 10, 15, 20}) {
    l.next(b);
    ASSERT_EQ(b.batch, 1);
    ASSERT_EQ(b.seq, 8);
    for (int i = 0; i < 8; ++i) {
      EXPECT_EQ(b.input_ids[i], start + i);
      EXPECT_EQ(b.labels[i], i < 7 ? start + i + 1 : -100);
      EXPECT_EQ(b.positions[i], i);
    }
  }
  EXPECT_EQ(l.epoch(), 0);
  EXPECT_EQ(next_starts(l, 2), (std::vector<int32_t>{0, 5}));  // wrapped into epoch 1, same order unshuffled
  EXPECT_EQ(l.epoch(), 1);
}

TEST(BatchLoaderTest, NoStrideDropsPartialTail) {
  EXPECT_EQ(BatchLoader(iota_tokens(32), loader_cfg(8, 0, 1, false), 1, 0, 1).num_windows(), 4);
  BatchLoader l(iota_tokens(31), loader_cfg(8, 0, 2, false), 1, 0, 1);
  EXPECT_EQ(l.num_windows(), 3);
  mxt::Batch b;
  l.next(b);  // two rows per batch, filled in order
  ASSERT_EQ(b.input_ids.size(), 16u);
  EXPECT_EQ(b.input_ids[0], 0);
  EXPECT_EQ(b.input_ids[8], 8);
  EXPECT_EQ(b.labels[15], -100);
  EXPECT_EQ(b.positions[8], 0);
  EXPECT_EQ(BatchLoader(iota_tokens(8), loader_cfg(8, 0, 1, false), 1, 0, 1).num_windows(), 1);
}

TEST(BatchLoaderTest, RejectsBadSettings) {
  EXPECT_THROW(BatchLoader(iota_tokens(100), loader_cfg(8, 8, 1, false), 1, 0, 1), mxt::ConfigError);
  EXPECT_THROW(BatchLoader(iota_tokens(100), loader_cfg(8, -1, 1, false), 1, 0, 1), mxt::ConfigError);
  EXPECT_THROW(BatchLoader(iota_tokens(100), loader_cfg(8, 0, 0, false), 1, 0, 1), mxt::ConfigError);
  EXPECT_THROW(BatchLoader(iota_tokens(7), loader_cfg(8, 0, 1, false), 1, 0, 1), DataError);
  EXPECT_THROW(BatchLoader(iota_tokens(16), loader_cfg(8, 0, 1, false), 1, 0, 4), DataError);  // 2 windows, 4 ranks
  EXPECT_THROW(BatchLoader(iota_tokens(100), loader_cfg(8, 0, 1, false), 1, 2, 2), std::invalid_argument);
}

TEST(BatchLoaderTest, ShuffleDeterministicPermutationPerEpoch) {
  const auto cfg = loader_cfg(4, 0, 1, true);  // 50 windows of 4 tokens
  BatchLoader a(iota_tokens(200), cfg, 42, 0, 1), b(iota_tokens(200), cfg, 42, 0, 1);
  const auto ea0 = next_starts(a, 50), ea1 = next_starts(a, 50);
  EXPECT_EQ(ea0, next_starts(b, 50));
  EXPECT_EQ(ea1, next_starts(b, 50));
  std::vector<int32_t> sorted = ea0, all;
  std::sort(sorted.begin(), sorted.end());
  for (int i = 0; i < 50; ++i) all.push_back(4 * i);
  EXPECT_EQ(sorted, all);  // every window exactly once per epoch
  EXPECT_NE(ea0, all);     // ... but not in corpus order
  EXPECT_NE(ea0, ea1);     // and reshuffled per epoch
  BatchLoader c(iota_tokens(200), cfg, 43, 0, 1);
  EXPECT_NE(next_starts(c, 50), ea0);  // another seed, another order
}

TEST(BatchLoaderTest, ShuffleOrderPinned) {
  // The order depends only on (seed, epoch) through our own splitmix64, so it is the same on every platform.
  BatchLoader l(iota_tokens(40), loader_cfg(4, 0, 1, true), 42, 0, 1);
  EXPECT_EQ(next_starts(l, 10), (std::vector<int32_t>{4, 24, 36, 16, 8, 12, 20, 0, 32, 28}));
}

TEST(BatchLoaderTest, ShardsDisjointAcrossRanks) {
  for (int world : {2, 4}) {
    const auto cfg = loader_cfg(4, 1, 1, true);  // step 3: 1000 tokens -> 333 windows
    std::vector<BatchLoader> ranks;
    for (int r = 0; r < world; ++r) ranks.emplace_back(iota_tokens(1000), cfg, 7, r, world);
    const int64_t per = ranks[0].windows_per_epoch();
    EXPECT_EQ(per, 333 / world);
    for (int epoch = 0; epoch < 3; ++epoch) {
      std::set<int32_t> seen;
      for (auto& l : ranks) {
        const auto s = next_starts(l, static_cast<int>(per));
        EXPECT_EQ(l.epoch(), epoch);
        for (int32_t x : s) {
          EXPECT_EQ(x % 3, 0);
          EXPECT_TRUE(seen.insert(x).second) << "world " << world << " epoch " << epoch << " window " << x;
        }
      }
      EXPECT_EQ(seen.size(), static_cast<size_t>(per * world));
    }
  }
}

TEST(BatchLoaderTest, UnshuffledShardsInterleave) {
  BatchLoader r1(iota_tokens(80), loader_cfg(8, 0, 1, false), 0, 1, 4);  // 10 windows, 2 per rank
  EXPECT_EQ(next_starts(r1, 3), (std::vector<int32_t>{8, 40, 8}));
}

TEST(BatchLoaderTest, SetPositionResumesExactly) {
  const auto cfg = loader_cfg(16, 4, 3, true);  // step 12: 2000 tokens -> 166 windows; 41 per rank of 4
  BatchLoader a(iota_tokens(2000), cfg, 9, 1, 4);
  mxt::Batch b;
  for (int i = 0; i < 20; ++i) a.next(b);  // 60 rows: into epoch 1
  ASSERT_EQ(a.epoch(), 1);
  const int64_t epoch = a.epoch(), cursor = a.cursor();
  std::vector<std::vector<int32_t>> want;
  for (int i = 0; i < 30; ++i) {
    a.next(b);
    want.push_back(b.input_ids);
  }
  BatchLoader r(iota_tokens(2000), cfg, 9, 1, 4);
  r.set_position(epoch, cursor);
  for (int i = 0; i < 30; ++i) {
    r.next(b);
    EXPECT_EQ(b.input_ids, want[i]) << "batch " << i;
  }
  EXPECT_EQ(r.epoch(), a.epoch());
  EXPECT_EQ(r.cursor(), a.cursor());
  EXPECT_THROW(r.set_position(0, r.windows_per_epoch() + 1), DataError);
  EXPECT_THROW(r.set_position(-1, 0), DataError);
}
