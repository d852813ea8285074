// The token stream a DatasetConfig names: the embedded corpus, or FASTA / token files concatenated in order.
// Every token is checked against the vocabulary here, where the file it came from is still known.
#include <string>
#include <vector>

#include "mxtrain/data.hpp"
#include "mxtrain/rng.hpp"

namespace mxt {
namespace {

void check_vocab(const std::vector<int32_t>& t, const std::string& origin, int64_t vocab_size) {
  for (size_t i = 0; i < t.size(); ++i)
    if (t[i] < 0 || t[i] >= vocab_size)
      throw DataError(origin + ": token " + std::to_string(t[i]) + " at token offset " + std::to_string(i) +
                      " is outside the vocabulary (vocab_size " + std::to_string(vocab_size) + ")");
}

}  // namespace

// Uniform ids from a fixed seed (splitmix64's state per position, so the stream is the same on every machine);
// the modulo's bias is below 2^-46 for any vocabulary that fits an int32.
std::vector<int32_t> random_tokens(int64_t n, int64_t vocab_size) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  uint64_t state = 0x6d78747261696eull;  // "mxtrain"
  for (auto& v : t) v = static_cast<int32_t>(splitmix64(state) % static_cast<uint64_t>(vocab_size));
  return t;
}

std::vector<int32_t> load_tokens(const DatasetConfig& cfg, int64_t vocab_size) {
  if (vocab_size <= 0) throw DataError("load_tokens: vocab_size must be positive, got " + std::to_string(vocab_size));
  std::vector<int32_t> all;
  if (cfg.source == "embedded") {
    all = embedded_corpus_tokens();
    check_vocab(all, "embedded corpus", vocab_size);
  } else if (cfg.source == "random") {
    all = random_tokens(kRandomCorpusTokens, vocab_size);
  } else if (cfg.source == "fasta" || cfg.source == "tokens") {
    if (cfg.paths.empty())
      throw DataError("dataset.source=" + cfg.source + " needs at least one file in dataset.paths");
    for (const auto& path : cfg.paths) {
      const auto t = cfg.source == "fasta" ? read_fasta_tokens(path, cfg.eos_token_id)
                                           : read_token_file(path, cfg.token_dtype);
      check_vocab(t, "'" + path + "'", vocab_size);
      all.insert(all.end(), t.begin(), t.end());
    }
  } else {
    throw DataError("unknown dataset.source '" + cfg.source + "' (expected embedded, random, fasta or tokens)");
  }
  // Labels shift inside a window (HF), so one full window is the least that makes a training row.
  if (static_cast<int64_t>(all.size()) < cfg.max_seq_length)
    throw DataError("dataset (" + cfg.source + ") has " + std::to_string(all.size()) +
                    " tokens, fewer than one window of max_seq_length = " + std::to_string(cfg.max_seq_length));
  return all;
}

}  // namespace mxt
