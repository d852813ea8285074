// Plain FASTA -> byte-level tokens: one token per residue (its upper-cased byte), eos after each non-empty
// record. Headers are dropped: the model learns sequences, not names. Errors name file, record and line.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "data/read_file.hpp"
#include "mxtrain/data.hpp"

namespace mxt {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; }
bool is_upper(char c) { return c >= 'A' && c <= 'Z'; }
bool is_lower(char c) { return c >= 'a' && c <= 'z'; }

std::string show_char(char c) {
  const auto u = static_cast<unsigned char>(c);
  char buf[32];
  if (u >= 0x20 && u < 0x7f)
    std::snprintf(buf, sizeof buf, "'%c' (0x%02X)", c, u);
  else
    std::snprintf(buf, sizeof buf, "byte 0x%02X", u);
  return buf;
}

}  // namespace

std::vector<int32_t> read_fasta_tokens(const std::string& path, int64_t eos_token_id) {
  if (eos_token_id < 0 || eos_token_id > INT32_MAX)
    throw DataError("FASTA '" + path + "': eos_token_id " + std::to_string(eos_token_id) + " out of range");
  const std::string text = detail::read_whole_file(path, "FASTA file");

  std::vector<int32_t> tokens;
  tokens.reserve(text.size());
  int64_t record = 0, in_record = 0, total = 0;
  std::string header;
  auto end_record = [&] {
    if (in_record > 0) tokens.push_back(static_cast<int32_t>(eos_token_id));  // empty records add nothing
  };

  size_t pos = 0;
  for (int64_t line_no = 1; pos < text.size(); ++line_no) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    size_t b = pos;
    while (b < nl && is_space(text[b])) ++b;
    if (b < nl && text[b] == '>') {
      end_record();
      ++record;
      in_record = 0;
      size_t e = nl;
      while (e > b + 1 && is_space(text[e - 1])) --e;  // drops the '\r' of CRLF too
      header = text.substr(b + 1, e - b - 1);
    } else {
      for (size_t i = b; i < nl; ++i) {
        const char c = text[i];
        if (is_space(c)) continue;
        if (record == 0)
          throw DataError("FASTA '" + path + "' line " + std::to_string(line_no) +
                          ": sequence data before the first '>' header");
        if (!is_upper(c) && !is_lower(c) && c != '*' && c != '-')
          throw DataError("FASTA '" + path + "' record " + std::to_string(record) + " (>" + header + "), line " +
                          std::to_string(line_no) + ", column " + std::to_string(i - pos + 1) +
                          ": invalid character " + show_char(c));
        tokens.push_back(is_lower(c) ? c - 'a' + 'A' : c);
        ++in_record;
        ++total;
      }
    }
    pos = nl + 1;
  }
  end_record();

  if (record == 0) throw DataError("FASTA '" + path + "' is empty (no '>' records)");
  if (total == 0)
    throw DataError("FASTA '" + path + "' has " + std::to_string(record) + " record(s) but no sequence data");
  return tokens;
}

}  // namespace mxt
