// Megatron indexed datasets (MMIDIDX .idx/.bin): written by an independent writer (tests/write_mmidx.py, the
// published layout, standard library only) and read back token for token in every dtype; every kind of
// damage gives a DataError naming the file; `mxtrain preprocess` writes the same bytes as that writer.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <sstream>
#include <string>
#include <vector>

#include "data/seq_source.hpp"
#include "data/token_source.hpp"
#include "data_test_util.hpp"

using dtest::data_error;
using dtest::read_bytes;
using dtest::TempDir;
using mxt::detail::TokenSource;
using ::testing::HasSubstr;

namespace {

using Seqs = std::vector<std::vector<double>>;  // doubles: the float dtypes need fractions too

// Writes prefix.{idx,bin} with the Python writer; false (and a skip message) without python3.
bool py_write(const TempDir& d, const std::string& prefix, const std::string& dtype, const Seqs& seqs,
              const std::string& flags = "") {
  if (!std::filesystem::exists("/usr/bin/python3")) return false;
  std::ostringstream text;
  text << std::setprecision(17);
  for (const auto& s : seqs) {
    for (size_t i = 0; i < s.size(); ++i) text << (i ? " " : "") << s[i];
    text << "\n";
  }
  const std::string in = d.write("seqs.txt", text.str());
  const std::string cmd = "/usr/bin/python3 " MXTRAIN_SOURCE_DIR "/tests/write_mmidx.py " + prefix + " " + dtype +
                          " " + flags + " < " + in;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  return true;
}
#define PY_WRITE_OR_SKIP(...) \
  if (!py_write(__VA_ARGS__)) GTEST_SKIP() << "/usr/bin/python3 is missing: the independent writer cannot run"

std::vector<int32_t> doc(const TokenSource& s, int64_t d) {
  std::vector<int32_t> out(static_cast<size_t>(s.doc_len(d)));
  s.read_doc(d, 0, s.doc_len(d), out.data());
  return out;
}

void expect_docs(const TokenSource& s, const Seqs& want, const std::string& what) {
  ASSERT_EQ(s.num_docs(), static_cast<int64_t>(want.size())) << what;
  std::vector<int32_t> all;
  for (size_t i = 0; i < want.size(); ++i) {
    std::vector<int32_t> w;
    for (double x : want[i]) w.push_back(static_cast<int32_t>(x));
    EXPECT_EQ(doc(s, static_cast<int64_t>(i)), w) << what << " sequence " << i;
    all.insert(all.end(), w.begin(), w.end());
  }
  std::vector<int32_t> stream(all.size());
  s.read_stream(0, static_cast<int64_t>(all.size()), stream.data());
  EXPECT_EQ(stream, all) << what;
  if (all.size() > 3) {  // a read that starts and ends inside sequences
    std::vector<int32_t> mid(all.size() - 2);
    s.read_stream(1, static_cast<int64_t>(mid.size()), mid.data());
    EXPECT_EQ(mid, std::vector<int32_t>(all.begin() + 1, all.end() - 1)) << what;
  }
}

const Seqs kSeqs = {{1, 2, 3}, {}, {4, 5, 6, 7, 100}, {0}, {99, 98}};

}  // namespace

TEST(DataMmidx, EveryDtypeReadsBackTokenForToken) {
  TempDir d;
  for (const char* dt : {"uint8", "int8", "int16", "int32", "int64", "float64", "float32", "uint16"}) {
    const std::string prefix = d.path(std::string("ds_") + dt);
    PY_WRITE_OR_SKIP(d, prefix, dt, kSeqs);
    const auto s = TokenSource::open_mmidx(prefix);
    EXPECT_STREQ(mxt::detail::dtype_name(s->dtype()), dt);
    expect_docs(*s, kSeqs, dt);
    EXPECT_EQ(TokenSource::open_mmidx(prefix + ".idx")->total_tokens(), 11);  // .idx / .bin name the prefix too
    EXPECT_EQ(TokenSource::open_mmidx(prefix + ".bin")->num_docs(), 5);
  }
}

TEST(DataMmidx, LargeIdsMultimodalGapsAndDocumentGroups) {
  TempDir d;
  const Seqs big = {{128255, 70000, 3}, {65535, 0}, {7}};
  PY_WRITE_OR_SKIP(d, d.path("big"), "int32", big, "--multimodal --gap-bytes 3 --documents 2,3");
  expect_docs(*TokenSource::open_mmidx(d.path("big")), big, "int32 with modes, gaps, 2 documents");
  PY_WRITE_OR_SKIP(d, d.path("u16"), "uint16", {{65535, 1}});
  expect_docs(*TokenSource::open_mmidx(d.path("u16")), {{65535, 1}}, "uint16 max");
}

TEST(DataMmidx, TokensOutsideTheVocabularyNameSequenceAndOffset) {
  TempDir d;
  PY_WRITE_OR_SKIP(d, d.path("v"), "uint16", {{1, 2}, {3, 4, 500, 6}});
  const auto s = TokenSource::open_mmidx(d.path("v"));
  s->set_limit(256);
  std::vector<int32_t> out(6);
  const std::string msg = data_error([&] { s->read_stream(0, 6, out.data()); });
  EXPECT_THAT(msg, HasSubstr(d.path("v") + "' sequence 2, token offset 2: token 500 (uint16)"));
  EXPECT_THAT(msg, HasSubstr("[0, 256)"));
  PY_WRITE_OR_SKIP(d, d.path("neg"), "int8", {{1, -3}});
  EXPECT_THAT(data_error([&] { TokenSource::open_mmidx(d.path("neg"))->read_doc(0, 0, 2, out.data()); }),
              HasSubstr("token -3 (int8)"));
  PY_WRITE_OR_SKIP(d, d.path("frac"), "float32", {{1.5}});
  EXPECT_THAT(data_error([&] { TokenSource::open_mmidx(d.path("frac"))->read_doc(0, 0, 1, out.data()); }),
              HasSubstr("token 1.5 (float32)"));
}

TEST(DataMmidx, DamagedFilesGiveClearErrors) {
  TempDir d;
  const Seqs seqs = {{1, 2}, {3}, {4, 5, 6}};
  PY_WRITE_OR_SKIP(d, d.path("good"), "uint16", seqs);
  const std::string idx = read_bytes(d.path("good.idx")), bin = read_bytes(d.path("good.bin"));
  auto variant = [&](const std::string& name, const std::string& i, const std::string& b) {
    d.write(name + ".idx", i);
    d.write(name + ".bin", b);
    return data_error([&] { TokenSource::open_mmidx(d.path(name)); });
  };
  auto with_byte = [&](size_t at, char v) {
    std::string s = idx;
    s[at] = v;
    return s;
  };
  struct Case {
    std::string name, idx, bin, want, file;
  };
  std::string broken_docs = idx;
  broken_docs[idx.size() - 32] = 1;  // the first document index must be 0
  const Case cases[] = {
      {"empty", "", bin, "the file is empty", ".idx"},
      {"magic", with_byte(0, 'X'), bin, "no \"MMIDIDX\" magic", ".idx"},
      {"header", idx.substr(0, 20), bin, "shorter than the 34-byte header", ".idx"},
      {"version", with_byte(9, 2), bin, "version 2, expected 1", ".idx"},
      {"dtype", with_byte(17, 9), bin, "unknown dtype code 9", ".idx"},
      {"arrays", idx.substr(0, idx.size() - 8), bin,
       "truncated: 3 sequences and 4 document indices need 102 bytes, the file has 94", ".idx"},
      {"trailing", idx + "12345", bin, "5 unexpected bytes after the document indices", ".idx"},
      {"docs", broken_docs, bin, "document index 0 is 1", ".idx"},
      {"shortbin", idx, bin.substr(0, bin.size() - 2), "is shorter than its index says: sequence 3 of 3", ".bin"},
      {"nobin", idx, "", "is shorter than its index says: sequence 1 of 3", ".bin"},
  };
  for (const Case& c : cases) {
    const std::string msg = variant(c.name, c.idx, c.bin);
    EXPECT_THAT(msg, HasSubstr(c.want)) << c.name;
    EXPECT_THAT(msg, HasSubstr(d.path(c.name) + c.file)) << c.name;
  }
  std::filesystem::remove(d.path("good.bin"));
  EXPECT_THAT(data_error([&] { TokenSource::open_mmidx(d.path("good")); }),
              HasSubstr(d.path("good.bin") + "' does not exist"));
  PY_WRITE_OR_SKIP(d, d.path("none"), "uint8", {});
  EXPECT_THAT(data_error([&] { TokenSource::open_mmidx(d.path("none")); }), HasSubstr("holds no sequences"));
  PY_WRITE_OR_SKIP(d, d.path("zeros"), "uint8", {{}, {}});
  EXPECT_THAT(data_error([&] { TokenSource::open_mmidx(d.path("zeros")); }), HasSubstr("hold no tokens"));
}

// ------------------------------------------------------------------------------------------- preprocess

TEST(DataPreprocess, MatchesTheIndependentWriterByteForByte) {
  TempDir d;
  std::string fa, fq;
  for (int i = 0; i < 50; ++i) {
    std::string s;
    for (int j = 0; j < 20 + (i * 37) % 90; ++j) s += "ACGTNacgtn"[(i * 7 + j * 3) % 10];
    fa += ">rec" + std::to_string(i) + "\n" + s.substr(0, s.size() / 2) + "\n" + s.substr(s.size() / 2) + "\n";
    if (i % 10 == 0) fa += ">empty\n";
    fq += "@q" + std::to_string(i) + "\n" + s + "\n+\n" + std::string(s.size(), 'I') + "\n";
  }
  mxt::PreprocessOptions opt;
  opt.inputs = {d.write_gz("a.fa.gz", fa), d.write("b.fq", fq)};
  opt.output_prefix = d.path("out/genome");
  opt.bos_token_id = 2;
  opt.eos_token_id = 0;
  opt.progress_interval_s = 0;  // print every update (stderr)
  const mxt::PreprocessStats st = mxt::run_preprocess(opt);
  EXPECT_EQ(st.records, 100);
  EXPECT_EQ(st.empty, 5);
  EXPECT_FALSE(std::filesystem::exists(d.path("out/genome.idx.tmp")));

  // The same tokens through the in-memory reader, then through the Python writer.
  const mxt::detail::Tokenizer tok("nucleotide", true);
  mxt::detail::RecordOptions ro;
  ro.bos = 2;
  ro.eos = 0;
  Seqs seqs;
  for (const auto& [path, fmt] : {std::pair{opt.inputs[0], mxt::detail::SeqReader::Format::Fasta},
                                  std::pair{opt.inputs[1], mxt::detail::SeqReader::Format::Fastq}}) {
    mxt::detail::RecordStats rs;
    const auto src = mxt::detail::tokenize_file(path, fmt, tok, ro, rs);
    for (int64_t i = 0; i < src->num_docs(); ++i) {
      const auto t = doc(*src, i);
      seqs.emplace_back(t.begin(), t.end());
    }
  }
  ASSERT_EQ(seqs.size(), 100u);
  PY_WRITE_OR_SKIP(d, d.path("py"), "uint8", seqs);
  EXPECT_EQ(read_bytes(d.path("out/genome.idx")), read_bytes(d.path("py.idx")));
  EXPECT_EQ(read_bytes(d.path("out/genome.bin")), read_bytes(d.path("py.bin")));
  expect_docs(*TokenSource::open_mmidx(d.path("out/genome")), seqs, "preprocess output");
}

TEST(DataPreprocess, BadRecordsFailOrAreCountedAndDtypeChecked) {
  TempDir d;
  mxt::PreprocessOptions opt;
  opt.inputs = {d.write("x.fa", ">a\nACGT\n>b\nACQT\n>c\nGG\n")};
  opt.output_prefix = d.path("x");
  EXPECT_THAT(data_error([&] { mxt::run_preprocess(opt); }), HasSubstr("record 2 (>b), line 4, column 3"));
  EXPECT_FALSE(std::filesystem::exists(d.path("x.idx")));
  opt.skip_bad_records = true;
  EXPECT_EQ(mxt::run_preprocess(opt).skipped, 1);
  EXPECT_EQ(TokenSource::open_mmidx(d.path("x"))->num_docs(), 2);
  opt.eos_token_id = 300;
  opt.dtype = "uint8";
  EXPECT_THROW(mxt::run_preprocess(opt), mxt::ConfigError);
  opt.dtype = "auto";
  mxt::run_preprocess(opt);
  EXPECT_EQ(TokenSource::open_mmidx(d.path("x"))->dtype(), mxt::TokenDType::U16);
  opt.inputs = {d.write("notes.txt", ">a\nAC\n")};
  EXPECT_THROW(mxt::run_preprocess(opt), mxt::ConfigError);  // the format cannot be told from the name
  opt.format = "fasta";
  EXPECT_EQ(mxt::run_preprocess(opt).records, 1);
}
