#pragma once
// Token sources (embedded corpus, FASTA, flat token files) and the windowed, shuffled batch loader.
#include <cstdint>
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
// Plain FASTA: one token per base/residue (its byte value, upper-cased); eos_token_id after each record.
std::vector<int32_t> read_fasta_tokens(const std::string& path, int64_t eos_token_id);
// Flat binary token file of little-endian uint16 or uint32.
std::vector<int32_t> read_token_file(const std::string& path, const std::string& dtype);
// The tokens a DatasetConfig names (all paths concatenated); checks every token < vocab_size.
std::vector<int32_t> load_tokens(const DatasetConfig& cfg, int64_t vocab_size);

struct Batch {
  int64_t batch = 0, seq = 0;
  std::vector<int32_t> input_ids;  // [batch*seq]
  std::vector<int32_t> labels;     // [batch*seq], next token; -100 where none
  std::vector<int32_t> positions;  // [batch*seq], 0..seq-1 per row
};

// Windows of max_seq_length tokens, consecutive windows sharing `stride` tokens (the recipe's stride);
// a deterministic shuffle per epoch from the seed; rank r of world w reads windows r, r+w, ...
class BatchLoader {
 public:
  BatchLoader(std::vector<int32_t> tokens, const DatasetConfig& cfg, uint64_t seed, int rank, int world);
  void next(Batch& out);  // fills micro_batch_size rows
  int64_t num_windows() const { return static_cast<int64_t>(starts_.size()); }
  // Windows this rank reads per epoch: num_windows / world (the remainder is skipped so ranks stay in step).
  int64_t windows_per_epoch() const;
  int64_t epoch() const { return epoch_; }
  int64_t cursor() const { return cursor_; }
  // The position, for exact resume.
  void set_position(int64_t epoch, int64_t cursor);

 private:
  void reshuffle();
  std::vector<int32_t> tokens_;
  DatasetConfig cfg_;
  uint64_t seed_;
  int rank_, world_;
  std::vector<int64_t> starts_;  // window start offsets
  std::vector<int64_t> order_;   // this epoch's order of windows
  int64_t epoch_ = 0, cursor_ = 0;
};

}  // namespace mxt
