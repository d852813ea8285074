#pragma once
// One token source: documents of tokens in one typed byte buffer, owned (tokenized FASTA/FASTQ, the embedded
// corpus) or memory-mapped (Megatron indexed datasets, flat token files). Reads convert to int32 and check
// every token against the vocabulary, so a bad token is reported with its file, document and offset.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mxtrain/data.hpp"

namespace mxt::detail {

size_t dtype_size(TokenDType t);
const char* dtype_name(TokenDType t);
bool dtype_from_code(int code, TokenDType& out);  // Megatron's codes 1..8

// A growable typed token buffer (what the FASTA/FASTQ readers fill).
class TokenBuffer {
 public:
  explicit TokenBuffer(TokenDType t) : dtype_(t), width_(dtype_size(t)) {}
  void push(int32_t v) {
    const size_t at = bytes_.size();
    bytes_.resize(at + width_);
    store(bytes_.data() + at, v);
  }
  void append(const int32_t* v, size_t n);
  size_t size() const { return bytes_.size() / width_; }
  TokenDType dtype() const { return dtype_; }
  std::vector<uint8_t>& bytes() { return bytes_; }

 private:
  void store(uint8_t* p, int32_t v) const;
  TokenDType dtype_;
  size_t width_;
  std::vector<uint8_t> bytes_;
};

class TokenSource {
 public:
  // Owned tokens: `doc_ends` are cumulative token counts (doc i is [doc_ends[i-1], doc_ends[i])).
  static std::shared_ptr<TokenSource> from_buffer(std::string name, TokenBuffer buf, std::vector<int64_t> doc_ends,
                                                  std::string unit = "record");
  static std::shared_ptr<TokenSource> from_tokens(std::string name, std::vector<int32_t> tokens);
  // A Megatron .idx/.bin pair by prefix (a path ending in .idx or .bin is taken as its prefix).
  static std::shared_ptr<TokenSource> open_mmidx(const std::string& path);
  // A flat little-endian token file (one document), memory-mapped.
  static std::shared_ptr<TokenSource> open_token_file(const std::string& path, TokenDType dtype);

  const std::string& name() const { return name_; }
  TokenDType dtype() const { return dtype_; }
  int64_t num_docs() const { return static_cast<int64_t>(start_.size()) - 1; }
  int64_t doc_len(int64_t d) const { return start_[d + 1] - start_[d]; }
  int64_t doc_start(int64_t d) const { return start_[d]; }  // offset in the concatenated stream
  int64_t total_tokens() const { return start_.back(); }
  // Tokens must be in [0, limit): set to the vocabulary size before training.
  void set_limit(int64_t limit) { limit_ = limit; }

  // n tokens of the concatenated stream from offset `at` (documents back to back).
  void read_stream(int64_t at, int64_t n, int32_t* out) const;
  // n tokens of document d from offset `off`.
  void read_doc(int64_t d, int64_t off, int64_t n, int32_t* out) const;
  // "sequence 12" / "record 12": how messages name a document.
  std::string doc_label(int64_t d) const { return unit_ + " " + std::to_string(d + 1); }

 private:
  TokenSource() = default;
  void convert(int64_t d, int64_t off, int64_t n, int32_t* out) const;

  std::string name_, unit_ = "document";
  TokenDType dtype_ = TokenDType::I32;
  size_t width_ = 4;
  const uint8_t* data_ = nullptr;
  std::shared_ptr<const void> owner_;  // keeps data_ alive (a vector or a mapping)
  std::vector<int64_t> start_{0};      // n+1 cumulative token offsets
  std::vector<int64_t> ptr_;           // byte offset of each document (empty: start_ * width_)
  int64_t limit_ = int64_t{1} << 31;  // any int32 id
};

}  // namespace mxt::detail
