// FASTA / FASTQ records from plain or gzip files, one at a time (see seq_reader.hpp).
//
// FASTA: '>' starts a record; sequence lines until the next '>' (any wrapping); blank lines and ';' comment
//   lines are ignored; spaces, tabs and '\r' inside sequence lines are dropped.
// FASTQ: '@' header, sequence line(s) up to a line starting with '+', then quality lines until they hold as
//   many characters as the sequence (wrapped FASTQ reads too); qualities must be printable ('!'..'~').
#include "data/seq_reader.hpp"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>

#include "mxtrain/data.hpp"

namespace mxt::detail {

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; }

std::string_view trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && is_space(s[b])) ++b;
  while (e > b && is_space(s[e - 1])) --e;
  return s.substr(b, e - b);
}

constexpr size_t kChunk = size_t{1} << 20;

}  // namespace

std::string show_char(char c) {
  const auto u = static_cast<unsigned char>(c);
  char buf[32];
  if (u >= 0x20 && u < 0x7f)
    std::snprintf(buf, sizeof buf, "'%c' (0x%02X)", c, u);
  else
    std::snprintf(buf, sizeof buf, "byte 0x%02X", u);
  return buf;
}

bool format_from_name(const std::string& path, SeqReader::Format& out) {
  std::string n = std::filesystem::path(path).filename().string();
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const char* gz : {".gz", ".bgz"}) {
    const size_t l = std::strlen(gz);
    if (n.size() > l && n.compare(n.size() - l, l, gz) == 0) n.resize(n.size() - l);
  }
  const size_t dot = n.rfind('.');
  const std::string ext = dot == std::string::npos ? "" : n.substr(dot + 1);
  for (const char* e : {"fa", "fasta", "fna", "faa", "ffn", "frn", "fas", "mfa", "seq"})
    if (ext == e) return out = SeqReader::Format::Fasta, true;
  for (const char* e : {"fq", "fastq"})
    if (ext == e) return out = SeqReader::Format::Fastq, true;
  return false;
}

// ------------------------------------------------------------------------------------------ LineReader

LineReader::LineReader(const std::string& path, const char* what) : path_(path), what_(what) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) throw DataError(what_ + " '" + path + "' does not exist");
  if (fs::is_directory(path, ec)) throw DataError(what_ + " '" + path + "' is a directory");
  f_ = gzopen(path.c_str(), "rb");
  if (!f_) throw DataError("cannot open " + what_ + " '" + path + "' for reading: " + std::strerror(errno));
  gzbuffer(f_, 1 << 18);
  buf_.resize(kChunk);
}

LineReader::~LineReader() {
  if (f_) gzclose(f_);
}

int64_t LineReader::compressed_offset() const { return f_ ? static_cast<int64_t>(gzoffset(f_)) : 0; }

bool LineReader::fill() {
  if (begin_ > 0) {  // keep the unfinished line at the front
    std::memmove(buf_.data(), buf_.data() + begin_, end_ - begin_);
    end_ -= begin_;
    begin_ = 0;
  }
  if (end_ == buf_.size()) buf_.resize(buf_.size() * 2);  // one line longer than the buffer
  const unsigned want = static_cast<unsigned>(std::min<size_t>(buf_.size() - end_, size_t{1} << 30));
  const int n = gzread(f_, buf_.data() + end_, want);
  if (n < 0) {
    int err = 0;
    const char* msg = gzerror(f_, &err);
    if (err == Z_BUF_ERROR)
      throw DataError(what_ + " '" + path_ + "': the gzip stream ends early near line " +
                      std::to_string(line_no_ + 1) + " (truncated or damaged file)");
    throw DataError("error reading " + what_ + " '" + path_ + "' near line " + std::to_string(line_no_ + 1) + ": " +
                    (msg ? msg : "unknown zlib error"));
  }
  if (n == 0) {
    int err = 0;
    gzerror(f_, &err);
    if (err == Z_BUF_ERROR)  // zlib's "unexpected end of file" inside a gzip member
      throw DataError(what_ + " '" + path_ + "': the gzip stream ends early near line " +
                      std::to_string(line_no_ + 1) + " (truncated or damaged file)");
    eof_ = true;
    return false;
  }
  end_ += static_cast<size_t>(n);
  return true;
}

bool LineReader::next(std::string_view& line) {
  size_t scanned = begin_;  // bytes already known to hold no '\n'
  for (;;) {
    const char* base = buf_.data();
    const void* nl = std::memchr(base + scanned, '\n', end_ - scanned);
    if (nl || (eof_ && begin_ < end_)) {
      const size_t stop = nl ? static_cast<size_t>(static_cast<const char*>(nl) - base) : end_;
      size_t len = stop - begin_;
      if (len > 0 && base[begin_ + len - 1] == '\r') --len;
      line = std::string_view(base + begin_, len);
      begin_ = nl ? stop + 1 : end_;
      ++line_no_;
      return true;
    }
    if (eof_) return false;
    scanned = end_ - begin_;  // relative: fill() moves the unfinished line to the front
    fill();
    scanned += begin_;
  }
}

// ------------------------------------------------------------------------------------------ SeqReader

std::string SeqRecord::where(int64_t residue) const {
  auto it = std::upper_bound(line_starts.begin(), line_starts.end(), std::make_pair(residue, INT64_MAX));
  const int64_t l = it == line_starts.begin() ? line : std::prev(it)->second;
  return "line " + std::to_string(l);
}

SeqReader::SeqReader(const std::string& path, Format format, const Alphabet& alphabet)
    : in_(path, format == Format::Fasta ? "FASTA file" : "FASTQ file"), format_(format), alphabet_(alphabet) {}

bool SeqReader::next(SeqRecord& r) {
  r.name.clear();
  r.seq.clear();
  r.error.clear();
  r.line_starts.clear();
  r.index = 0;
  r.line = 0;
  return format_ == Format::Fasta ? next_fasta(r) : next_fastq(r);
}

std::string SeqReader::prefix(const SeqRecord& r) const {
  return std::string(kind()) + " '" + in_.path() + "' record " + std::to_string(r.index) + " (" +
         (format_ == Format::Fasta ? ">" : "@") + r.name + ")";
}

void SeqReader::add_residues(SeqRecord& r, std::string_view line) {
  const size_t before = r.seq.size();
  r.seq.resize(before + line.size());
  char* out = r.seq.data() + before;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (is_space(c)) continue;
    if (!alphabet_.ok[static_cast<unsigned char>(c)] && r.error.empty())
      r.error = prefix(r) + ", line " + std::to_string(in_.line_no()) + ", column " + std::to_string(i + 1) +
                ": invalid character " + show_char(c) + " (not in the " + alphabet_.name + " alphabet)";
    *out++ = c;  // kept after an error too, so FASTQ can still match the quality length
  }
  r.seq.resize(static_cast<size_t>(out - r.seq.data()));
  if (r.seq.size() > before) r.line_starts.emplace_back(static_cast<int64_t>(before), in_.line_no());
}

bool SeqReader::next_fasta(SeqRecord& r) {
  std::string_view line;
  if (!have_pending_) {
    for (;;) {  // up to the first header
      if (!in_.next(line)) return false;
      const std::string_view t = trim(line);
      if (t.empty() || t[0] == ';') continue;
      if (t[0] == '>') {
        pending_.assign(t);
        pending_line_ = in_.line_no();
        have_pending_ = true;
        break;
      }
      r.line = in_.line_no();
      r.error = "FASTA '" + in_.path() + "' line " + std::to_string(r.line) +
                ": sequence data before the first '>' header";
      while (in_.next(line)) {  // resume at the first header
        const std::string_view h = trim(line);
        if (!h.empty() && h[0] == '>') {
          pending_.assign(h);
          pending_line_ = in_.line_no();
          have_pending_ = true;
          break;
        }
      }
      return true;
    }
  }
  r.index = ++records_;
  r.name.assign(trim(std::string_view(pending_).substr(1)));
  r.line = pending_line_;
  have_pending_ = false;
  while (in_.next(line)) {
    const std::string_view t = trim(line);
    if (!t.empty() && t[0] == '>') {
      pending_.assign(t);
      pending_line_ = in_.line_no();
      have_pending_ = true;
      break;
    }
    if (t.empty() || t[0] == ';') continue;
    add_residues(r, line);
  }
  return true;
}

bool SeqReader::next_fastq(SeqRecord& r) {
  std::string_view line;
  std::string header;
  if (have_pending_) {
    header = pending_;
    r.line = pending_line_;
    have_pending_ = false;
  } else {
    for (;;) {
      if (!in_.next(line)) return false;
      if (!trim(line).empty()) break;
    }
    header.assign(line);
    r.line = in_.line_no();
  }
  r.index = ++records_;
  if (header[0] != '@') {
    r.error = "FASTQ '" + in_.path() + "' line " + std::to_string(r.line) + ": expected '@' to start record " +
              std::to_string(r.index) + ", got " + show_char(header[0]);
    while (in_.next(line))  // resume at the next line that looks like a header
      if (!line.empty() && line[0] == '@') {
        pending_.assign(line);
        pending_line_ = in_.line_no();
        have_pending_ = true;
        break;
      }
    return true;
  }
  r.name.assign(trim(std::string_view(header).substr(1)));
  for (;;) {
    if (!in_.next(line)) {
      if (r.error.empty())
        r.error = prefix(r) + " ends at line " + std::to_string(in_.line_no()) +
                  " without its '+' line (truncated file?)";
      return true;
    }
    if (!line.empty() && line[0] == '+') break;
    add_residues(r, line);
  }
  const int64_t n = static_cast<int64_t>(r.seq.size());
  int64_t q = 0;
  while (q < n) {
    if (!in_.next(line)) {
      if (r.error.empty())
        r.error = prefix(r) + ": the quality ends after " + std::to_string(q) + " of " + std::to_string(n) +
                  " characters at the end of the file (truncated file?)";
      return true;
    }
    const std::string_view t = trim(line);
    for (size_t i = 0; i < t.size(); ++i)
      if ((t[i] < '!' || t[i] > '~') && r.error.empty())
        r.error = prefix(r) + ", line " + std::to_string(in_.line_no()) + ", column " + std::to_string(i + 1) +
                  ": invalid quality character " + show_char(t[i]);
    q += static_cast<int64_t>(t.size());
  }
  if (q != n && r.error.empty())
    r.error = prefix(r) + ", line " + std::to_string(in_.line_no()) + ": the quality has " + std::to_string(q) +
              " characters but the sequence has " + std::to_string(n);
  return true;
}

}  // namespace mxt::detail
