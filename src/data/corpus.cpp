// open_corpus: from dataset.* to token sources. Paths are files, globs (sorted matches) or, for indexed
// datasets, prefixes; each path's format is dataset.source, or with source=auto what its name says.
// Without dataset.weights every file is a part of one source, read as one stream in path order (what
// dataset.source=fasta|tokens always did); with weights each path (all its glob matches) is a source.
#include <glob.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <numeric>
#include <set>

#include "data/seq_source.hpp"
#include "data/token_source.hpp"
#include "mxtrain/data.hpp"

namespace mxt {

using detail::TokenSource;

Corpus::Corpus(std::vector<int32_t> tokens) {
  Source s;
  s.name = "in-memory tokens";
  s.parts.push_back(TokenSource::from_tokens("in-memory tokens", std::move(tokens)));
  sources_.push_back(std::move(s));
}

Corpus::Corpus(std::vector<Source> sources) : sources_(std::move(sources)) {
  if (sources_.empty()) throw DataError("the dataset has no sources");
  double total = 0;
  for (const Source& s : sources_) {
    if (s.parts.empty()) throw DataError("dataset source '" + s.name + "' has no files");
    if (!(s.weight > 0)) throw DataError("dataset source '" + s.name + "' has weight " + std::to_string(s.weight));
    total += s.weight;
  }
  for (Source& s : sources_) s.weight /= total;
}

int64_t Corpus::num_tokens() const {
  int64_t n = 0;
  for (const Source& s : sources_)
    for (const auto& p : s.parts) n += p->total_tokens();
  return n;
}

int64_t Corpus::num_docs() const {
  int64_t n = 0;
  for (const Source& s : sources_)
    for (const auto& p : s.parts) n += p->num_docs();
  return n;
}

std::string Corpus::describe() const {
  std::string out;
  for (const Source& s : sources_) {
    int64_t docs = 0, tokens = 0;
    for (const auto& p : s.parts) docs += p->num_docs(), tokens += p->total_tokens();
    if (!out.empty()) out += "\n";
    out += s.name + ": " + std::to_string(s.parts.size()) + " file(s), " + std::to_string(docs) + " documents, " +
           std::to_string(tokens) + " tokens";
    if (sources_.size() > 1) out += ", weight " + std::to_string(s.weight);
  }
  return out;
}

namespace {

enum class Format { Fasta, Fastq, Mmidx, Tokens };

bool has_glob(const std::string& p) { return p.find_first_of("*?[") != std::string::npos; }

std::string strip_mmidx_ext(const std::string& p) {
  for (const char* ext : {".idx", ".bin"})
    if (p.size() > 4 && p.compare(p.size() - 4, 4, ext) == 0) return p.substr(0, p.size() - 4);
  return p;
}

Format format_of(const std::string& path, const std::string& source, size_t i) {
  if (source == "fasta") return Format::Fasta;
  if (source == "fastq") return Format::Fastq;
  if (source == "mmidx") return Format::Mmidx;
  if (source == "tokens") return Format::Tokens;
  detail::SeqReader::Format f;
  if (detail::format_from_name(path, f)) return f == detail::SeqReader::Format::Fasta ? Format::Fasta : Format::Fastq;
  if (strip_mmidx_ext(path) != path || std::filesystem::exists(path + ".idx")) return Format::Mmidx;
  throw DataError("dataset.paths[" + std::to_string(i) + "] '" + path +
                  "': dataset.source=auto cannot tell its format from the name (.fa/.fasta/.fna/.faa[.gz] FASTA, "
                  ".fq/.fastq[.gz] FASTQ, an indexed-dataset prefix or .idx/.bin); set dataset.source");
}

// The files a path names: a glob's sorted matches (mmidx: their prefixes, once each), or the path.
std::vector<std::string> expand(const std::string& path, const std::string& source, size_t i) {
  if (!has_glob(path)) return {path};
  glob_t g{};
  const int rc = ::glob(path.c_str(), 0, nullptr, &g);
  std::vector<std::string> out;
  if (rc == 0)
    for (size_t k = 0; k < g.gl_pathc; ++k) out.emplace_back(g.gl_pathv[k]);
  globfree(&g);
  if (out.empty()) throw DataError("dataset.paths[" + std::to_string(i) + "] '" + path + "' matches no file");
  std::vector<std::string> files;
  std::set<std::string> seen;
  for (const auto& f : out) {
    if (std::filesystem::is_directory(f)) continue;
    const bool mm = format_of(f, source, i) == Format::Mmidx;
    const std::string name = mm ? strip_mmidx_ext(f) : f;
    if (seen.insert(name).second) files.push_back(name);
  }
  if (files.empty()) throw DataError("dataset.paths[" + std::to_string(i) + "] '" + path + "' matches only directories");
  return files;
}

void check_special(const char* key, int64_t id, const detail::Tokenizer& tok, int64_t vocab) {
  if (id < 0) return;
  if (id >= vocab)
    throw DataError(std::string(key) + " (" + std::to_string(id) + ") is outside the vocabulary (vocab_size " +
                    std::to_string(vocab) + ")");
  const char c = tok.residue_of(static_cast<int32_t>(id));
  if (c)
    throw DataError(std::string(key) + " (" + std::to_string(id) + ") is also the id of residue '" + c + "' under the " +
                    tok.name() + " tokenizer; choose an id no residue uses");
}

}  // namespace

Corpus open_corpus(const DatasetConfig& cfg, int64_t vocab) {
  if (vocab <= 0) throw DataError("open_corpus: vocab_size must be positive, got " + std::to_string(vocab));
  if (cfg.builtin_source()) {
    Corpus c(load_tokens(cfg, vocab));  // checks the vocabulary and the window length
    for (const auto& p : c.sources()[0].parts) p->set_limit(vocab);
    return c;
  }
  if (cfg.paths.empty()) throw DataError("dataset.source=" + cfg.source + " needs at least one file in dataset.paths");
  if (!cfg.weights.empty() && cfg.weights.size() != cfg.paths.size())
    throw DataError("dataset.weights has " + std::to_string(cfg.weights.size()) + " entries for " +
                    std::to_string(cfg.paths.size()) + " paths");

  const detail::Tokenizer tok(cfg.tokenizer, cfg.uppercase);
  detail::RecordOptions ro;
  ro.bos = cfg.bos_token_id;
  ro.eos = cfg.eos_token_id;
  ro.sep = cfg.sequence_packing ? -1 : cfg.sep_token_id;  // packed documents need no separator
  ro.skip_bad = cfg.skip_bad_records;
  bool tokenizer_checked = false;

  std::vector<Corpus::Source> sources;
  for (size_t i = 0; i < cfg.paths.size(); ++i) {
    if (cfg.weights.empty() && !sources.empty()) {
      // one source for all paths
    } else {
      Corpus::Source s;
      s.name = cfg.weights.empty() ? (cfg.paths.size() == 1 ? cfg.paths[0] : "dataset.paths") : cfg.paths[i];
      s.weight = cfg.weights.empty() ? 1.0 : cfg.weights[i];
      sources.push_back(std::move(s));
    }
    for (const std::string& file : expand(cfg.paths[i], cfg.source, i)) {
      std::shared_ptr<TokenSource> part;
      switch (format_of(file, cfg.source, i)) {
        case Format::Fasta:
        case Format::Fastq: {
          if (!tokenizer_checked) {
            if (tok.max_residue_id() >= vocab)
              throw DataError("the " + tok.name() + " tokenizer's ids go up to " +
                              std::to_string(tok.max_residue_id()) + ", outside the vocabulary (vocab_size " +
                              std::to_string(vocab) + ")");
            check_special("dataset.bos_token_id", ro.bos, tok, vocab);
            check_special("dataset.eos_token_id", ro.eos, tok, vocab);
            check_special("dataset.sep_token_id", ro.sep, tok, vocab);
            if (cfg.sequence_packing && !cfg.split_samples_in_token_packing)
              check_special("dataset.pad_token_id", cfg.pad_token_id, tok, vocab);
            tokenizer_checked = true;
          }
          const auto f = format_of(file, cfg.source, i) == Format::Fasta ? detail::SeqReader::Format::Fasta
                                                                           : detail::SeqReader::Format::Fastq;
          detail::RecordStats st;
          part = detail::tokenize_file(file, f, tok, ro, st);
          if (st.skipped > 0)
            spdlog::warn("{}: skipped {} malformed record(s) of {} (dataset.skip_bad_records); the first: {}", file,
                         st.skipped, st.records + st.skipped + st.empty, st.first_error);
          if (st.empty > 0) spdlog::info("{}: {} record(s) without residues left out", file, st.empty);
          break;
        }
        case Format::Mmidx:
          part = TokenSource::open_mmidx(file);
          break;
        case Format::Tokens:
          if (cfg.token_dtype != "uint16" && cfg.token_dtype != "uint32")
            throw DataError("token file '" + file + "': unknown token_dtype '" + cfg.token_dtype +
                            "' (expected uint16 or uint32)");
          part = TokenSource::open_token_file(file, cfg.token_dtype == "uint16" ? TokenDType::U16 : TokenDType::U32);
          break;
      }
      part->set_limit(vocab);
      sources.back().parts.push_back(std::move(part));
    }
  }
  return Corpus(std::move(sources));
}

}  // namespace mxt
