// FASTA / FASTQ parsing (plain and gzip), the tokenizers and special tokens, and malformed input: every
// error names file, record and line; skip_bad_records counts and resumes at the next record.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "data/seq_source.hpp"
#include "data_test_util.hpp"

using dtest::bytes_of;
using dtest::data_error;
using dtest::TempDir;
using mxt::detail::RecordOptions;
using mxt::detail::RecordStats;
using mxt::detail::SeqReader;
using mxt::detail::Tokenizer;
using ::testing::HasSubstr;

namespace {

struct Read {
  std::vector<int32_t> stream;     // all tokens back to back
  std::vector<int64_t> doc_lens;   // tokens per document
  RecordStats stats;
};

Read read(const std::string& path, SeqReader::Format f, const std::string& tokenizer = "byte",
          RecordOptions opt = {}, bool uppercase = true) {
  const Tokenizer tok(tokenizer, uppercase);
  Read r;
  const auto src = mxt::detail::tokenize_file(path, f, tok, opt, r.stats);
  r.stream.resize(static_cast<size_t>(src->total_tokens()));
  src->read_stream(0, src->total_tokens(), r.stream.data());
  for (int64_t d = 0; d < src->num_docs(); ++d) r.doc_lens.push_back(src->doc_len(d));
  return r;
}
const auto kFasta = SeqReader::Format::Fasta;
const auto kFastq = SeqReader::Format::Fastq;

std::vector<int32_t> cat(std::initializer_list<std::vector<int32_t>> parts) {
  std::vector<int32_t> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

}  // namespace

// ------------------------------------------------------------------------------------------------ FASTA

TEST(DataFasta, MultiLineLowercaseNRunsCrlfEmptyRecordsAndComments) {
  TempDir d;
  const std::string text =
      "; an old-style comment line\r\n>chr1 first\r\nACGTNNNN\r\nnnnnacgt\r\n\r\n>empty\r\n>chr2\r\n  GG CC\t\r\nTT";
  const auto p = d.write("a.fa", text);
  const Read r = read(p, kFasta);
  EXPECT_EQ(r.stream, cat({bytes_of("ACGTNNNNNNNNACGT"), {0}, bytes_of("GGCCTT"), {0}}));
  EXPECT_EQ(r.doc_lens, (std::vector<int64_t>{17, 7}));
  EXPECT_EQ(r.stats.records, 2);
  EXPECT_EQ(r.stats.empty, 1);
}

TEST(DataFasta, GzipSingleAndMultiMemberEqualPlain) {
  TempDir d;
  std::string text;
  for (int i = 0; i < 300; ++i) text += ">r" + std::to_string(i) + "\n" + std::string(50 + i % 7, "ACGT"[i % 4]) + "\nac\n";
  const Read plain = read(d.write("p.fa", text), kFasta);
  EXPECT_EQ(read(d.write_gz("g.fa.gz", text), kFasta).stream, plain.stream);
  EXPECT_EQ(read(d.write_gz("m.fa.gz", text, 3), kFasta).stream, plain.stream);  // concatenated members
  EXPECT_EQ(plain.stats.records, 300);
}

TEST(DataFasta, TruncatedGzipIsAnError) {
  TempDir d;
  std::string text;
  for (int i = 0; i < 2000; ++i) text += ">r\nACGTTGCAAGGCTTAACCGGTA\n";
  const std::string gz = dtest::read_bytes(d.write_gz("full.fa.gz", text));
  const auto p = d.write("cut.fa.gz", gz.substr(0, gz.size() / 2));
  const std::string msg = data_error([&] { read(p, kFasta); });
  EXPECT_THAT(msg, HasSubstr(p));
  EXPECT_THAT(msg, HasSubstr("gzip stream ends early"));
}

TEST(DataFasta, LineLongerThanTheReadBuffer) {
  TempDir d;
  std::string seq(3'000'000, 'A');
  for (size_t i = 0; i < seq.size(); i += 7) seq[i] = 'C';
  const Read r = read(d.write_gz("long.fa.gz", ">chrom\n" + seq + "\n>b\nT\n"), kFasta);
  ASSERT_EQ(r.doc_lens, (std::vector<int64_t>{3'000'001, 2}));
  EXPECT_EQ(std::vector<int32_t>(r.stream.begin(), r.stream.begin() + 3'000'000), bytes_of(seq));
}

TEST(DataFasta, UnknownResidueNamesFileRecordLineColumn) {
  TempDir d;
  const auto p = d.write("bad.fa", ">ok\nACGT\n>second one\nACGT\nACET\n");
  const std::string msg = data_error([&] { read(p, kFasta, "nucleotide"); });
  EXPECT_THAT(msg, HasSubstr(p));
  EXPECT_THAT(msg, HasSubstr("record 2 (>second one)"));
  EXPECT_THAT(msg, HasSubstr("line 5, column 3"));
  EXPECT_THAT(msg, HasSubstr("'E' (0x45)"));
  EXPECT_THAT(msg, HasSubstr("nucleotide"));
  // The byte tokenizer takes any letter.
  EXPECT_EQ(read(p, kFasta).stats.records, 2);
}

TEST(DataFasta, SkipBadRecordsCountsAndKeepsTheRest) {
  TempDir d;
  const auto p = d.write("mixed.fa", "AC\n>a\nACGT\n>b\nAC9T\n>c\nGG\n>d\nA?\n>e\nTT\n");
  RecordOptions opt;
  opt.skip_bad = true;
  opt.eos = -1;
  const Read r = read(p, kFasta, "nucleotide", opt);
  EXPECT_EQ(r.stream, bytes_of("ACGTGGTT"));
  EXPECT_EQ(r.stats.skipped, 3);  // the data before the first header, b and d
  EXPECT_THAT(r.stats.first_error, HasSubstr("before the first '>' header"));
  opt.skip_bad = false;
  EXPECT_THAT(data_error([&] { read(p, kFasta, "nucleotide", opt); }), HasSubstr("line 1"));
}

TEST(DataFasta, EmptyFilesAndAllBadRecords) {
  TempDir d;
  EXPECT_THAT(data_error([&] { read(d.write("e.fa", ""), kFasta); }), HasSubstr("is empty"));
  EXPECT_THAT(data_error([&] { read(d.write("e.fa.gz", ""), kFasta); }), HasSubstr("is empty"));
  EXPECT_THAT(data_error([&] { read(d.write_gz("z.fa.gz", ""), kFasta); }), HasSubstr("is empty"));
  EXPECT_THAT(data_error([&] { read(d.write("h.fa", ">a\n>b\n\n"), kFasta); }),
              HasSubstr("2 record(s) but no sequence data"));
  RecordOptions skip;
  skip.skip_bad = true;
  EXPECT_THAT(data_error([&] { read(d.write("b.fa", ">a\nA1\n>b\nC2\n"), kFasta, "nucleotide", skip); }),
              HasSubstr("all 2 record(s) are malformed or empty"));
  EXPECT_THAT(data_error([&] { read(d.path("missing.fa"), kFasta); }), HasSubstr("does not exist"));
  EXPECT_THAT(data_error([&] { read(d.str(), kFasta); }), HasSubstr("is a directory"));
}

// ------------------------------------------------------------------------------------------------ FASTQ

TEST(DataFastq, RecordsWrappedCrlfAndGzip) {
  TempDir d;
  const std::string text =
      "@read1 desc\nACGTN\n+\nIIIII\n\n@read2\r\nAC\r\nGT\r\n+read2\r\nII\r\n#!\r\n@read3\nacgt\n+\n@@@@\n";
  const Read r = read(d.write("r.fq", text), kFastq, "nucleotide");
  EXPECT_EQ(r.stream, cat({bytes_of("ACGTN"), {0}, bytes_of("ACGT"), {0}, bytes_of("ACGT"), {0}}));
  EXPECT_EQ(r.stats.records, 3);  // a quality line starting with '@' is not mistaken for a header
  EXPECT_EQ(read(d.write_gz("r.fq.gz", text), kFastq, "nucleotide").stream, r.stream);
}

TEST(DataFastq, MalformedRecordsNameTheProblem) {
  TempDir d;
  struct Case {
    const char* text;
    const char* want;
  };
  const Case cases[] = {
      {"@a\nACGT\n+\nIII\n", "the quality ends after 3 of 4 characters"},
      {"@a\nACGT\n+\nIIIII\n", "the quality has 5 characters but the sequence has 4"},
      {"@a\nACGT\n", "without its '+' line"},
      {"read\nACGT\n+\nIIII\n", "expected '@' to start record 1"},
      {"@a\nACGT\n+\nII I\x01\n", "invalid quality character"},
      {"@a\nACXT\n+\nIIII\n", "line 2, column 3: invalid character 'X'"},
  };
  for (const Case& c : cases) {
    const auto p = d.write("bad.fq", c.text);
    const std::string msg = data_error([&] { read(p, kFastq, "nucleotide"); });
    EXPECT_THAT(msg, HasSubstr(c.want)) << c.text;
    EXPECT_THAT(msg, HasSubstr(p)) << c.text;
  }
}

TEST(DataFastq, SkipResynchronisesOnTheNextRecord) {
  TempDir d;
  const std::string text =
      "@good1\nAC\n+\nII\n"
      "garbage line\n"            // not a header: skipped up to the next line starting with '@'
      "@short\nACGT\n+\nII\n"     // quality too short: "@good2" is taken as more quality, too long now
      "@good2\nGG\n+\nII\n"       // ... so "GG" is not a header either: skipped up to "@bad"
      "@bad\nAZ\n+\nII\n"
      "@good3\nTT\n+\nII\n";
  RecordOptions opt;
  opt.skip_bad = true;
  opt.eos = -1;
  const Read r = read(d.write("m.fq", text), kFastq, "nucleotide", opt);
  EXPECT_EQ(r.stream, bytes_of("ACTT"));
  EXPECT_EQ(r.stats.records, 2);
  EXPECT_EQ(r.stats.skipped, 4);
}

// ------------------------------------------------------------------------------------------------ tokenizers

TEST(DataTokenizer, NucleotideIupacCaseAndGaps) {
  TempDir d;
  const auto p = d.write("n.fa", ">a\nACGTURYSWKMBDHVN-acgtn\n");
  RecordOptions opt;
  opt.eos = -1;
  EXPECT_EQ(read(p, kFasta, "nucleotide", opt).stream, bytes_of("ACGTURYSWKMBDHVN-ACGTN"));
  EXPECT_EQ(read(p, kFasta, "nucleotide", opt, false).stream, bytes_of("ACGTURYSWKMBDHVN-acgtn"));
}

TEST(DataTokenizer, ProteinEsm2IdsAmbiguityCodesAndStop) {
  TempDir d;
  RecordOptions opt;
  opt.bos = 0, opt.eos = 2;  // ESM-2's <cls> and <eos>
  // ESM-2: L4 A5 G6 V7 S8 E9 R10 T11 I12 D13 P14 K15 Q16 N17 F18 Y19 M20 H21 W22 C23 X24 B25 U26 Z27 O28 .29 -30
  const Read r = read(d.write("p.fa", ">p1\nMKVLAG\nwcxbuzo*\n>p2\n.-J\n"), kFasta, "protein", opt);
  EXPECT_EQ(r.stream, (std::vector<int32_t>{0, 20, 15, 7, 4, 5, 6, 22, 23, 24, 25, 26, 27, 28, 2,  //
                                            0, 29, 30, 3, 2}));
  const std::string msg = data_error([&] { read(d.write("s.fa", ">p\nMK*V\n"), kFasta, "protein"); });
  EXPECT_THAT(msg, HasSubstr("'*' (stop) at residue 3 of 4 is only accepted as the last residue"));
  EXPECT_THAT(msg, HasSubstr("line 2"));
  EXPECT_THAT(data_error([&] { read(d.write("q.fa", ">p\nMK1\n"), kFasta, "protein"); }),
              HasSubstr("invalid character '1'"));
}

TEST(DataTokenizer, SpecialTokensLayout) {
  TempDir d;
  const auto p = d.write("s.fa", ">a\nAC\n>b\nG\n");
  RecordOptions opt;
  opt.bos = 5, opt.eos = 6, opt.sep = 7;
  const Read r = read(p, kFasta, "nucleotide", opt);
  EXPECT_EQ(r.stream, (std::vector<int32_t>{5, 'A', 'C', 6, 7, 5, 'G', 6, 7}));
  EXPECT_EQ(r.doc_lens, (std::vector<int64_t>{5, 4}));
  opt.bos = -1, opt.eos = -1, opt.sep = -1;
  EXPECT_EQ(read(p, kFasta, "nucleotide", opt).stream, bytes_of("ACG"));
}

TEST(DataTokenizer, SpecialTokenCollisionsAndVocabularyChecked) {
  TempDir d;
  mxt::DatasetConfig cfg;
  cfg.source = "fasta";
  cfg.tokenizer = "nucleotide";
  cfg.paths = {d.write("a.fa", ">a\nACGTACGT\n")};
  cfg.eos_token_id = 'A';
  EXPECT_THAT(data_error([&] { mxt::open_corpus(cfg, 256); }),
              HasSubstr("dataset.eos_token_id (65) is also the id of residue 'A' under the nucleotide tokenizer"));
  cfg.eos_token_id = 0;
  EXPECT_THAT(data_error([&] { mxt::open_corpus(cfg, 80); }), HasSubstr("outside the vocabulary (vocab_size 80)"));
  cfg.tokenizer = "protein";
  EXPECT_EQ(mxt::open_corpus(cfg, 33).num_tokens(), 9);  // ESM-2's 33 ids fit
}

TEST(DataTokenizer, ReverseComplementRunsKeepSpecialTokensInPlace) {
  const Tokenizer tok("nucleotide", false);
  std::vector<int32_t> t = cat({{5}, bytes_of("AACGTN"), {6, 7}, bytes_of("acgRY-"), {6}});
  tok.reverse_complement(t.data(), static_cast<int64_t>(t.size()));
  EXPECT_EQ(t, cat({{5}, bytes_of("NACGTT"), {6, 7}, bytes_of("-RYcgt"), {6}}));
  std::vector<int32_t> u = bytes_of("GATTACA");
  tok.reverse_complement(u.data(), 7);
  tok.reverse_complement(u.data(), 7);
  EXPECT_EQ(u, bytes_of("GATTACA"));  // an involution
}

// ------------------------------------------------------------------------------------------------ open_corpus

TEST(DataCorpus, AutoFormatsGlobsAndOneStreamWithoutWeights) {
  TempDir d;
  d.write("x1.fa", ">a\nAC\n");
  d.write_gz("x2.fa.gz", ">b\nGT\n");
  d.write("r.fastq", "@q\nTT\n+\nII\n");
  mxt::DatasetConfig cfg;
  cfg.source = "auto";
  cfg.tokenizer = "nucleotide";
  cfg.eos_token_id = 1;
  cfg.paths = {d.str() + "/x*.fa*", d.path("r.fastq")};
  const mxt::Corpus c = mxt::open_corpus(cfg, 256);
  ASSERT_EQ(c.sources().size(), 1u);
  EXPECT_EQ(c.sources()[0].parts.size(), 3u);
  EXPECT_EQ(c.num_tokens(), 9);
  EXPECT_EQ(c.num_docs(), 3);
  cfg.weights = {1, 3};
  const mxt::Corpus w = mxt::open_corpus(cfg, 256);
  ASSERT_EQ(w.sources().size(), 2u);
  EXPECT_DOUBLE_EQ(w.sources()[1].weight, 0.75);
  cfg.paths = {d.str() + "/nothing*.fa"};
  cfg.weights = {};
  EXPECT_THAT(data_error([&] { mxt::open_corpus(cfg, 256); }), HasSubstr("matches no file"));
  cfg.paths = {d.write("data.txt", "ACGT")};
  EXPECT_THAT(data_error([&] { mxt::open_corpus(cfg, 256); }), HasSubstr("cannot tell its format"));
}
