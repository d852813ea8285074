// Plain or gzip FASTA -> byte-level tokens as one stream: one token per residue (its upper-cased byte), eos
// after each non-empty record. Headers are dropped: the model learns sequences, not names. Errors name file,
// record and line (the streaming reader in seq_reader.cpp does the parsing).
#include <cstdint>
#include <string>
#include <vector>

#include "data/seq_source.hpp"
#include "mxtrain/data.hpp"

namespace mxt {

std::vector<int32_t> read_fasta_tokens(const std::string& path, int64_t eos_token_id) {
  if (eos_token_id < 0 || eos_token_id > INT32_MAX)
    throw DataError("FASTA '" + path + "': eos_token_id " + std::to_string(eos_token_id) + " out of range");
  const detail::Tokenizer tok("byte", true);
  detail::RecordOptions opt;
  opt.eos = eos_token_id;
  detail::RecordStats stats;
  const auto src = detail::tokenize_file(path, detail::SeqReader::Format::Fasta, tok, opt, stats);
  std::vector<int32_t> tokens(static_cast<size_t>(src->total_tokens()));
  src->read_stream(0, src->total_tokens(), tokens.data());
  return tokens;
}

}  // namespace mxt
