#pragma once
// Token sources (embedded corpus, FASTA/FASTQ plain or gzip, Megatron indexed datasets, flat token files),
// tokenizers, blending, and the windowed or packed, shuffled, sharded, prefetching batch loader.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mxtrain/config.hpp"

namespace mxt {

// Any bad-data error: the message names the file (and record / offset where it applies).
struct DataError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The corpus compiled into the binary: byte-level tokens (0..255), no download needed, learnable.
std::vector<int32_t> embedded_corpus_tokens();
// dataset.source=random: n ids uniform in [0, vocab_size), the same on every run and machine. Throughput
// benchmarks read it, as shared/bench/hf_baseline.py trains on random ids (nothing to learn: the loss stays
// near ln(vocab_size)); its routing is as balanced as random inputs make it, unlike text's skewed bytes.
inline constexpr int64_t kRandomCorpusTokens = int64_t{1} << 24;
std::vector<int32_t> random_tokens(int64_t n, int64_t vocab_size);
// Plain FASTA: one token per base/residue (its byte value, upper-cased); eos_token_id after each record.
std::vector<int32_t> read_fasta_tokens(const std::string& path, int64_t eos_token_id);
// Flat binary token file of little-endian uint16 or uint32.
std::vector<int32_t> read_token_file(const std::string& path, const std::string& dtype);
// The tokens a DatasetConfig names (all paths concatenated); checks every token < vocab_size.
// (The in-memory path of dataset.source=embedded|random|fasta|tokens; training goes through open_corpus.)
std::vector<int32_t> load_tokens(const DatasetConfig& cfg, int64_t vocab_size);

// Element types of token files: codes 1..8 are Megatron's indexed-dataset DType codes; U32 is ours
// (flat token files).
enum class TokenDType : uint8_t { U8 = 1, I8 = 2, I16 = 3, I32 = 4, I64 = 5, F64 = 6, F32 = 7, U16 = 8, U32 = 9 };

namespace detail {
class TokenSource;
}

// What the loader reads: sources, each a list of documents (from one or more files read back to back),
// blended by weight when there are several. One source without blending is read as one stream.
class Corpus {
 public:
  struct Source {
    std::string name;  // for logs and messages
    std::vector<std::shared_ptr<detail::TokenSource>> parts;
    double weight = 1.0;
  };
  Corpus(std::vector<int32_t> tokens);  // NOLINT(runtime/explicit): one in-memory stream (embedded, tests)
  explicit Corpus(std::vector<Source> sources);
  const std::vector<Source>& sources() const { return sources_; }
  int64_t num_tokens() const;
  int64_t num_docs() const;
  std::string describe() const;  // one line per source: name, files, documents, tokens, weight

 private:
  std::vector<Source> sources_;
};

// Opens what cfg names (dataset.source / paths / weights / tokenizer ...): tokenizes FASTA/FASTQ into memory,
// memory-maps indexed datasets and token files, and checks tokens against vocab_size (memory-mapped tokens
// as they are read). Bad data: DataError naming file and record, or a counted skip (skip_bad_records) that
// is logged.
Corpus open_corpus(const DatasetConfig& cfg, int64_t vocab_size);

struct Batch {
  int64_t batch = 0, seq = 0;
  std::vector<int32_t> input_ids;  // [batch*seq]
  std::vector<int32_t> labels;     // [batch*seq], next token; -100 where none
  std::vector<int32_t> positions;  // [batch*seq], 0..seq-1 per row; with packing they restart per document
  std::vector<int32_t> doc_ids;    // [batch*seq] with packing: the document of each token in its row (0, 1,
                                   // ...); empty without packing (plain causal attention)
};

// Where a loader is: `cursor` units (windows, or document chunks with packing) read in `epoch`, and with
// packing `offset` tokens of the next unit already given out (the recipe splits a document that does not
// fit the rest of a row; its tail starts the next row).
struct DataPosition {
  int64_t epoch = 0, cursor = 0, offset = 0;
  bool operator==(const DataPosition& o) const {
    return epoch == o.epoch && cursor == o.cursor && offset == o.offset;
  }
};

// Units: without packing, windows of max_seq_length tokens over each source's stream, consecutive windows
// sharing `stride` tokens (the recipe's stride); with packing (the recipe's use_sequence_packing), each
// document is cut into chunks of at most max_seq_length tokens (sharing `stride`), and chunks are packed
// back to back into rows, positions restarting at 0 and doc_ids telling attention where documents end.
// Order: a deterministic shuffle per epoch from the seed; rank r of world w reads units r, r+w, ... of each
// source; several sources are interleaved by weight. A background thread prepares `dataset.prefetch`
// micro-batches ahead; the position reported is that of the batches handed out.
class BatchLoader {
 public:
  BatchLoader(Corpus corpus, const DatasetConfig& cfg, uint64_t seed, int rank, int world);
  ~BatchLoader();
  BatchLoader(BatchLoader&&) noexcept;
  BatchLoader& operator=(BatchLoader&&) noexcept;
  void next(Batch& out);  // fills micro_batch_size rows
  int64_t num_windows() const;  // units over all sources
  // Units this rank reads per epoch: per source units / world (the remainder is skipped so ranks stay in
  // step), summed over sources.
  int64_t windows_per_epoch() const;
  int64_t epoch() const { return position().epoch; }
  int64_t cursor() const { return position().cursor; }
  int64_t offset() const { return position().offset; }
  DataPosition position() const;
  // The position, for exact resume (offset > 0 only with packing).
  void set_position(int64_t epoch, int64_t cursor, int64_t offset = 0);
  void set_position(const DataPosition& p) { set_position(p.epoch, p.cursor, p.offset); }
  // Seconds next() has spent waiting for the background reader (0 when it always keeps ahead).
  double wait_seconds() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// `mxtrain preprocess`: FASTA/FASTQ (plain or gzip) -> a Megatron indexed dataset (<prefix>.bin/.idx), one
// sequence and one document per record, with progress lines on stderr.
struct PreprocessOptions {
  std::vector<std::string> inputs;  // files or globs
  std::string output_prefix;
  std::string format = "auto";      // auto (by extension) | fasta | fastq
  std::string tokenizer = "nucleotide";
  std::string dtype = "auto";       // auto (smallest that holds every id) | uint8 | uint16 | int32
  bool uppercase = true;
  int64_t bos_token_id = -1, eos_token_id = 0;  // -1: none
  bool skip_bad_records = false;
  double progress_interval_s = 2.0;
};
struct PreprocessStats {
  int64_t records = 0, skipped = 0, empty = 0, tokens = 0, bytes_in = 0;
};
PreprocessStats run_preprocess(const PreprocessOptions& opt);

}  // namespace mxt
