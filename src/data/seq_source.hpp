#pragma once
// A FASTA/FASTQ file tokenized into memory as one token source: one document per record,
// [BOS] residues [EOS] [SEP] (each special token only when its id is >= 0); records without residues are
// dropped. Malformed records throw their DataError, or are counted and dropped with skip_bad.
#include <cstdint>
#include <memory>
#include <string>

#include "data/seq_reader.hpp"
#include "data/token_source.hpp"
#include "data/tokenizer.hpp"

namespace mxt::detail {

struct RecordOptions {
  int64_t bos = -1, eos = 0, sep = -1;  // -1: none
  bool skip_bad = false;
};

struct RecordStats {
  int64_t records = 0;  // kept
  int64_t skipped = 0;  // malformed, dropped (skip_bad)
  int64_t empty = 0;    // no residues
  int64_t tokens = 0;
  std::string first_error;  // of the first skipped record
};

// The element type that holds every id up to max_id.
TokenDType smallest_dtype(int64_t max_id);

std::shared_ptr<TokenSource> tokenize_file(const std::string& path, SeqReader::Format format, const Tokenizer& tok,
                                           const RecordOptions& opt, RecordStats& stats);

// "the file has 3 record(s) but no sequence data", "is empty" ...: the error for a file that gave nothing.
void check_not_empty(const std::string& path, SeqReader::Format format, const RecordStats& stats);

}  // namespace mxt::detail
