#pragma once
// Streaming FASTA and FASTQ readers over plain or gzip-compressed files (zlib reads both; gzip is detected
// by its magic, concatenated gzip members included). Records come out one at a time with their residues
// (whitespace removed, characters checked against the tokenizer's alphabet), so memory holds one record.
// A malformed record comes back with `error` set, naming file, record, line and column, and the reader
// resumes at the next record: the caller either throws it or counts a skip.
#include <zlib.h>

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace mxt::detail {

// Lines of a plain or gzip file. The last line need not end in '\n'; a '\r' before '\n' is dropped.
class LineReader {
 public:
  LineReader(const std::string& path, const char* what);
  ~LineReader();
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;
  // The next line (valid until the next call); false at the end of the file.
  bool next(std::string_view& line);
  int64_t line_no() const { return line_no_; }  // of the last line returned, 1-based
  int64_t compressed_offset() const;             // bytes of the file consumed so far (progress)
  const std::string& path() const { return path_; }

 private:
  bool fill();  // reads more; false at the end of the file
  std::string path_, what_;
  gzFile f_ = nullptr;
  std::vector<char> buf_;
  size_t begin_ = 0, end_ = 0;
  bool eof_ = false;
  int64_t line_no_ = 0;
};

struct SeqRecord {
  std::string name;     // the header line after '>' / '@', trailing whitespace removed
  std::string seq;      // residues as written, whitespace removed
  int64_t index = 0;    // 1-based record number in the file
  int64_t line = 0;     // line of its header
  std::string error;    // non-empty: the record is malformed (the message names file, record and line)
  // Where each sequence line starts in `seq`: (offset, line number), for messages about a residue.
  std::vector<std::pair<int64_t, int64_t>> line_starts;
  std::string where(int64_t residue) const;  // "line L" of residue i
};

// Which bytes may appear in a sequence, and how messages name the alphabet.
struct Alphabet {
  std::array<bool, 256> ok{};
  std::string name;  // e.g. "nucleotide (IUPAC)"
};

class SeqReader {
 public:
  enum class Format { Fasta, Fastq };
  SeqReader(const std::string& path, Format format, const Alphabet& alphabet);
  // The next record (possibly with error set); false at the end of the file.
  bool next(SeqRecord& r);
  const LineReader& lines() const { return in_; }
  const char* kind() const { return format_ == Format::Fasta ? "FASTA" : "FASTQ"; }
  std::string prefix(const SeqRecord& r) const;  // "FASTA 'path' record 3 (>name)"

 private:
  bool next_fasta(SeqRecord& r);
  bool next_fastq(SeqRecord& r);
  void add_residues(SeqRecord& r, std::string_view line);

  LineReader in_;
  Format format_;
  const Alphabet& alphabet_;
  int64_t records_ = 0;
  bool have_pending_ = false;  // FASTA: a header line read ahead
  std::string pending_;
  int64_t pending_line_ = 0;
};

// "'A' (0x41)" or "byte 0xC3".
std::string show_char(char c);
// Format::Fasta / Fastq from a file name (.fa .fasta .fna .faa .ffn .frn .fas .seq / .fq .fastq, optionally
// .gz); false if the name says neither.
bool format_from_name(const std::string& path, SeqReader::Format& out);

}  // namespace mxt::detail
