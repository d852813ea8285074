// `mxtrain preprocess`: FASTA/FASTQ (plain or gzip) -> a Megatron indexed dataset <prefix>.bin/.idx, for
// corpora too large to tokenize at every start. One sequence and one document per kept record, tokens
// [BOS] residues [EOS], written as they are read (memory holds one record and the per-record lengths).
// The layout is the one token_source.cpp documents (Megatron's _IndexWriter). Both files are written under
// a .tmp name, fsync'ed and renamed, the .idx last: an .idx on disk always has its whole .bin.
#include <fcntl.h>
#include <glob.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "data/seq_source.hpp"
#include "mxtrain/data.hpp"

namespace mxt {

namespace {

namespace fs = std::filesystem;
using detail::SeqReader;

class OutFile {
 public:
  explicit OutFile(std::string path) : path_(std::move(path)) {
    f_ = std::fopen(path_.c_str(), "wb");
    if (!f_) throw DataError("cannot create '" + path_ + "': " + std::strerror(errno));
    std::setvbuf(f_, nullptr, _IOFBF, 1 << 20);
  }
  ~OutFile() {
    if (f_) std::fclose(f_);
  }
  void write(const void* p, size_t n) {
    if (n && std::fwrite(p, 1, n, f_) != n)
      throw DataError("error writing '" + path_ + "': " + std::strerror(errno) + " (disk full?)");
  }
  void finish() {  // flush, fsync, close
    if (std::fflush(f_) != 0 || fsync(fileno(f_)) != 0)
      throw DataError("error writing '" + path_ + "': " + std::strerror(errno) + " (disk full?)");
    std::fclose(f_);
    f_ = nullptr;
  }

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
};

TokenDType parse_dtype(const std::string& s, int64_t max_id) {
  TokenDType t;
  if (s == "auto") return detail::smallest_dtype(max_id);
  if (s == "uint8") t = TokenDType::U8;
  else if (s == "uint16") t = TokenDType::U16;
  else if (s == "int32") t = TokenDType::I32;
  else if (s == "int64") t = TokenDType::I64;
  else throw ConfigError("preprocess --dtype '" + s + "': expected auto, uint8, uint16, int32 or int64");
  const int64_t cap = t == TokenDType::U8 ? 255 : t == TokenDType::U16 ? 65535 : INT32_MAX;
  if (max_id > cap)
    throw ConfigError("preprocess --dtype " + s + " cannot hold token id " + std::to_string(max_id));
  return t;
}

std::vector<std::string> expand_inputs(const std::vector<std::string>& inputs) {
  std::vector<std::string> files;
  for (const auto& in : inputs) {
    if (in.find_first_of("*?[") == std::string::npos) {
      files.push_back(in);
      continue;
    }
    glob_t g{};
    const int rc = ::glob(in.c_str(), 0, nullptr, &g);
    const size_t before = files.size();
    if (rc == 0)
      for (size_t k = 0; k < g.gl_pathc; ++k) files.emplace_back(g.gl_pathv[k]);
    globfree(&g);
    if (files.size() == before) throw DataError("preprocess input '" + in + "' matches no file");
  }
  return files;
}

std::string human(double v) {
  char b[32];
  if (v >= 1e9) std::snprintf(b, sizeof b, "%.2f G", v / 1e9);
  else if (v >= 1e6) std::snprintf(b, sizeof b, "%.2f M", v / 1e6);
  else if (v >= 1e3) std::snprintf(b, sizeof b, "%.1f k", v / 1e3);
  else std::snprintf(b, sizeof b, "%.0f ", v);
  return b;
}

void store(TokenDType t, const std::vector<int32_t>& v, std::vector<uint8_t>& out) {
  const size_t w = detail::dtype_size(t);
  out.resize(v.size() * w);
  uint8_t* p = out.data();
  for (size_t i = 0; i < v.size(); ++i, p += w) {
    switch (t) {
      case TokenDType::U8: *p = static_cast<uint8_t>(v[i]); break;
      case TokenDType::U16: { const uint16_t x = static_cast<uint16_t>(v[i]); std::memcpy(p, &x, 2); break; }
      case TokenDType::I64: { const int64_t x = v[i]; std::memcpy(p, &x, 8); break; }
      default: std::memcpy(p, &v[i], 4); break;
    }
  }
}

}  // namespace

PreprocessStats run_preprocess(const PreprocessOptions& opt) {
  if (opt.inputs.empty()) throw ConfigError("preprocess: no input files (--input)");
  if (opt.output_prefix.empty()) throw ConfigError("preprocess: no --output-prefix");
  if (opt.format != "auto" && opt.format != "fasta" && opt.format != "fastq")
    throw ConfigError("preprocess --format '" + opt.format + "': expected auto, fasta or fastq");
  const detail::Tokenizer tok(opt.tokenizer, opt.uppercase);
  for (const auto& [name, id] : {std::pair<const char*, int64_t>{"--bos-token-id", opt.bos_token_id},
                                 {"--eos-token-id", opt.eos_token_id}}) {
    if (id < -1 || id > INT32_MAX) throw ConfigError(std::string("preprocess ") + name + " " + std::to_string(id));
    if (id >= 0 && tok.residue_of(static_cast<int32_t>(id)))
      throw ConfigError(std::string("preprocess ") + name + " " + std::to_string(id) + " is also the id of residue '" +
                        tok.residue_of(static_cast<int32_t>(id)) + "' under the " + tok.name() + " tokenizer");
  }
  const int64_t max_id = std::max({static_cast<int64_t>(tok.max_residue_id()), opt.bos_token_id, opt.eos_token_id});
  const TokenDType dtype = parse_dtype(opt.dtype, max_id);
  const int64_t width = static_cast<int64_t>(detail::dtype_size(dtype));

  const std::vector<std::string> files = expand_inputs(opt.inputs);
  std::vector<SeqReader::Format> formats;
  for (const auto& f : files) {
    SeqReader::Format fmt = SeqReader::Format::Fasta;
    if (opt.format == "fastq") fmt = SeqReader::Format::Fastq;
    else if (opt.format == "auto" && !detail::format_from_name(f, fmt))
      throw ConfigError("preprocess: cannot tell whether '" + f + "' is FASTA or FASTQ from its name; use --format");
    formats.push_back(fmt);
  }
  const fs::path prefix(opt.output_prefix);
  if (prefix.has_parent_path()) fs::create_directories(prefix.parent_path());
  const std::string bin_path = opt.output_prefix + ".bin", idx_path = opt.output_prefix + ".idx";

  PreprocessStats st;
  std::vector<int32_t> lengths;
  OutFile bin(bin_path + ".tmp");
  std::vector<int32_t> tmp;
  std::vector<uint8_t> bytes;
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  auto last = t0;
  int64_t done_bytes = 0;
  auto progress = [&](size_t k, const detail::LineReader& in, bool final) {
    const auto now = clock::now();
    if (!final && std::chrono::duration<double>(now - last).count() < opt.progress_interval_s) return;
    last = now;
    const double el = std::chrono::duration<double>(now - t0).count();
    const double read = static_cast<double>(done_bytes + (final ? 0 : in.compressed_offset()));
    std::fprintf(stderr, "preprocess: %s %zu/%zu %s | %sB read | %lld records | %stokens | %sB/s%s\n",
                 final ? "done" : "file", k + 1, files.size(), files[k].c_str(), human(read).c_str(),
                 static_cast<long long>(st.records), human(static_cast<double>(st.tokens)).c_str(),
                 human(el > 0 ? read / el : 0).c_str(),
                 st.skipped ? (" | " + std::to_string(st.skipped) + " skipped").c_str() : "");
    std::fflush(stderr);
  };
  for (size_t k = 0; k < files.size(); ++k) {
    SeqReader reader(files[k], formats[k], tok.alphabet());
    detail::SeqRecord r;
    while (reader.next(r)) {
      std::string err = r.error;
      tmp.clear();
      if (err.empty()) {
        if (opt.bos_token_id >= 0) tmp.push_back(static_cast<int32_t>(opt.bos_token_id));
        err = tok.encode(r, reader.prefix(r), tmp);
      }
      if (!err.empty()) {
        if (!opt.skip_bad_records) throw DataError(err);
        if (st.skipped++ == 0) std::fprintf(stderr, "preprocess: skipping malformed record: %s\n", err.c_str());
        continue;
      }
      if (tmp.size() == (opt.bos_token_id >= 0 ? 1u : 0u)) {
        ++st.empty;
        continue;
      }
      if (opt.eos_token_id >= 0) tmp.push_back(static_cast<int32_t>(opt.eos_token_id));
      if (tmp.size() > static_cast<size_t>(INT32_MAX))
        throw DataError(reader.prefix(r) + ": " + std::to_string(tmp.size()) +
                        " tokens do not fit an indexed dataset's int32 sequence length");
      store(dtype, tmp, bytes);
      bin.write(bytes.data(), bytes.size());
      lengths.push_back(static_cast<int32_t>(tmp.size()));
      st.tokens += static_cast<int64_t>(tmp.size());
      ++st.records;
      if ((st.records & 1023) == 0) progress(k, reader.lines(), false);
    }
    done_bytes += reader.lines().compressed_offset();
    progress(k, reader.lines(), false);
  }
  st.bytes_in = done_bytes;
  if (st.records == 0)
    throw DataError("preprocess: no sequence data in " + std::to_string(files.size()) + " input file(s) (" +
                    std::to_string(st.empty) + " empty and " + std::to_string(st.skipped) + " malformed records)");
  bin.finish();

  OutFile idx(idx_path + ".tmp");
  idx.write("MMIDIDX\0\0", 9);
  const uint64_t version = 1, n = lengths.size(), m = n + 1;
  const uint8_t code = static_cast<uint8_t>(dtype);
  idx.write(&version, 8);
  idx.write(&code, 1);
  idx.write(&n, 8);
  idx.write(&m, 8);
  idx.write(lengths.data(), lengths.size() * 4);
  std::vector<int64_t> v(n);
  int64_t at = 0;
  for (uint64_t i = 0; i < n; ++i) v[i] = at, at += lengths[i] * width;
  idx.write(v.data(), v.size() * 8);
  v.resize(m);
  for (uint64_t i = 0; i < m; ++i) v[i] = static_cast<int64_t>(i);
  idx.write(v.data(), v.size() * 8);
  idx.finish();
  fs::rename(bin_path + ".tmp", bin_path);
  fs::rename(idx_path + ".tmp", idx_path);
  const double el = std::chrono::duration<double>(clock::now() - t0).count();
  std::fprintf(stderr,
               "preprocess: wrote %s.{bin,idx}: %lld sequences, %lld tokens (%s), %lld empty and %lld malformed "
               "records left out, %.1f s (%stokens/s)\n",
               opt.output_prefix.c_str(), static_cast<long long>(st.records), static_cast<long long>(st.tokens),
               detail::dtype_name(dtype), static_cast<long long>(st.empty), static_cast<long long>(st.skipped), el,
               human(el > 0 ? static_cast<double>(st.tokens) / el : 0).c_str());
  return st;
}

}  // namespace mxt
