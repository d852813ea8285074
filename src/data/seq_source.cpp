// FASTA/FASTQ -> an in-memory token source (see seq_source.hpp). Tokens are stored in the smallest element
// type that holds every id (one byte per base for the byte-level tokenizers with small special ids).
#include "data/seq_source.hpp"

#include <algorithm>

#include "mxtrain/data.hpp"

namespace mxt::detail {

TokenDType smallest_dtype(int64_t max_id) {
  if (max_id < 256) return TokenDType::U8;
  if (max_id < 65536) return TokenDType::U16;
  return TokenDType::I32;
}

void check_not_empty(const std::string& path, SeqReader::Format format, const RecordStats& s) {
  const bool fasta = format == SeqReader::Format::Fasta;
  const std::string kind = fasta ? "FASTA" : "FASTQ";
  if (s.records > 0) return;
  if (s.skipped > 0)
    throw DataError(kind + " '" + path + "': all " + std::to_string(s.skipped + s.empty) +
                    " record(s) are malformed or empty; the first malformed: " + s.first_error);
  if (s.empty > 0)
    throw DataError(kind + " '" + path + "' has " + std::to_string(s.empty) + " record(s) but no sequence data");
  throw DataError(kind + " '" + path + "' is empty (no '" + (fasta ? ">" : "@") + "' records)");
}

std::shared_ptr<TokenSource> tokenize_file(const std::string& path, SeqReader::Format format, const Tokenizer& tok,
                                           const RecordOptions& opt, RecordStats& stats) {
  SeqReader reader(path, format, tok.alphabet());
  const int64_t max_id = std::max({static_cast<int64_t>(tok.max_residue_id()), opt.bos, opt.eos, opt.sep});
  TokenBuffer buf(smallest_dtype(max_id));
  std::vector<int64_t> ends;
  std::vector<int32_t> tmp;
  SeqRecord r;
  auto bad = [&](const std::string& error) {
    if (!opt.skip_bad) throw DataError(error);
    if (stats.skipped++ == 0) stats.first_error = error;
  };
  while (reader.next(r)) {
    if (!r.error.empty()) {
      bad(r.error);
      continue;
    }
    tmp.clear();
    const std::string err = tok.encode(r, reader.prefix(r), tmp);
    if (!err.empty()) {
      bad(err);
      continue;
    }
    if (tmp.empty()) {
      ++stats.empty;
      continue;
    }
    if (opt.bos >= 0) buf.push(static_cast<int32_t>(opt.bos));
    buf.append(tmp.data(), tmp.size());
    if (opt.eos >= 0) buf.push(static_cast<int32_t>(opt.eos));
    if (opt.sep >= 0) buf.push(static_cast<int32_t>(opt.sep));
    ends.push_back(static_cast<int64_t>(buf.size()));
    ++stats.records;
  }
  check_not_empty(path, format, stats);
  stats.tokens += static_cast<int64_t>(buf.size());
  buf.bytes().shrink_to_fit();
  return TokenSource::from_buffer(path, std::move(buf), std::move(ends), "document");
}

}  // namespace mxt::detail
