// Reader throughput on this machine, printed for docs/perf.md: FASTA / FASTQ (plain and gzip) tokenized into
// memory, `mxtrain preprocess`, and the batch loader over a memory-mapped indexed dataset and a flat token
// file (windows and packed rows). Each must beat 1M tokens/s, 30x what the 8x1B benchmark consumes on one
// H200 (~32k tokens/s): reading never holds up training, even on one core.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <random>
#include <string>

#include "data/seq_source.hpp"
#include "data_test_util.hpp"

using dtest::TempDir;

namespace {

double seconds(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void report(const char* what, double tokens, double s) {
  const double rate = tokens / s;
  std::printf("[data throughput] %-44s %12.0f tokens in %6.3f s = %8.2f M tokens/s\n", what, tokens, s, rate / 1e6);
  EXPECT_GT(rate, 1e6) << what;
}

}  // namespace

TEST(DataThroughput, ReadersKeepFarAheadOfTraining) {
  TempDir d;
  std::mt19937 rng(1);
  std::string fasta, fastq;
  int64_t bases = 0;
  for (int r = 0; r < 160; ++r) {  // 160 records of 100 kb, 60 columns: 16 MB
    fasta += ">contig_" + std::to_string(r) + " synthetic\n";
    for (int line = 0; line < 1667; ++line) {
      for (int i = 0; i < 60; ++i) fasta += "ACGT"[rng() & 3];
      fasta += '\n';
      bases += 60;
    }
  }
  for (int r = 0; r < 40000; ++r) {  // 40k reads of 150 bases: 6 MB of sequence
    std::string s(150, 'A');
    for (char& c : s) c = "ACGT"[rng() & 3];
    fastq += "@read" + std::to_string(r) + "\n" + s + "\n+\n" + std::string(150, 'F') + "\n";
  }
  const std::string fa = d.write("g.fa", fasta), fq = d.write("r.fq", fastq);
  const std::string fagz = d.write_gz("g.fa.gz", fasta), fqgz = d.write_gz("r.fq.gz", fastq);
  const mxt::detail::Tokenizer tok("nucleotide", true);
  const mxt::detail::RecordOptions ro;
  for (const auto& [name, path, fmt] :
       {std::tuple{"FASTA -> memory (nucleotide)", fa, mxt::detail::SeqReader::Format::Fasta},
        std::tuple{"FASTA.gz -> memory", fagz, mxt::detail::SeqReader::Format::Fasta},
        std::tuple{"FASTQ -> memory", fq, mxt::detail::SeqReader::Format::Fastq},
        std::tuple{"FASTQ.gz -> memory", fqgz, mxt::detail::SeqReader::Format::Fastq}}) {
    mxt::detail::RecordStats st;
    const double s = seconds([&] { mxt::detail::tokenize_file(path, fmt, tok, ro, st); });
    report(name, static_cast<double>(st.tokens), s);
  }

  mxt::PreprocessOptions p;
  p.inputs = {fagz};
  p.output_prefix = d.path("g");
  p.progress_interval_s = 1e9;
  mxt::PreprocessStats pst;
  const double ps = seconds([&] { pst = mxt::run_preprocess(p); });
  report("preprocess FASTA.gz -> .bin/.idx", static_cast<double>(pst.tokens), ps);

  mxt::DatasetConfig c;
  c.source = "mmidx";
  c.paths = {d.path("g")};
  c.max_seq_length = 4096;
  c.stride = 0;
  c.micro_batch_size = 1;
  c.prefetch = 0;  // the reading itself, in this thread
  for (bool packing : {false, true}) {
    c.sequence_packing = packing;
    mxt::BatchLoader l(mxt::open_corpus(c, 128256), c, 42, 0, 1);
    mxt::Batch b;
    const int rows = 1500;
    const double s = seconds([&] {
      for (int i = 0; i < rows; ++i) l.next(b);
    });
    report(packing ? "loader, mmidx uint8, packed rows of 4096" : "loader, mmidx uint8, shuffled windows of 4096",
           rows * 4096.0, s);
  }
  // Flat uint16 token file, as Megatron-free pipelines dump them.
  std::string u16(8 << 20, '\0');
  for (size_t i = 0; i < u16.size(); i += 2) u16[i] = static_cast<char>(rng() & 0xff);
  c.source = "tokens";
  c.paths = {d.write("t.u16", u16)};
  c.sequence_packing = false;
  mxt::BatchLoader l(mxt::open_corpus(c, 128256), c, 42, 0, 1);
  mxt::Batch b;
  const double s = seconds([&] {
    for (int i = 0; i < 1000; ++i) l.next(b);
  });
  report("loader, uint16 token file, windows of 4096", 1000 * 4096.0, s);
  EXPECT_EQ(bases, 160 * 1667 * 60);
}
