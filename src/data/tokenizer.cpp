// Byte, nucleotide and protein tokenizers (see tokenizer.hpp): a 256-entry table from byte to id.
#include "data/tokenizer.hpp"

#include <algorithm>
#include <cctype>
#include <cstring>

#include "mxtrain/data.hpp"

namespace mxt::detail {

namespace {

// ESM-2's residue tokens in id order, starting at id 4 (after <cls> <pad> <eos> <unk>).
constexpr const char* kEsmResidues = "LAGVSERTIDPKQNFYMHWCXBUZO.-";
constexpr int32_t kEsmUnk = 3, kEsmFirstResidue = 4, kEsmLast = 32;  // <mask>

// IUPAC nucleotide codes and their complements (upper case; lower case mirrors them).
constexpr const char* kIupac = "ACGTURYSWKMBDHVN";
constexpr const char* kIupacComplement = "TGCAAYRSWMKVHDBN";

}  // namespace

Tokenizer::Tokenizer(const std::string& name, bool uppercase) : name_(name), uppercase_(uppercase) {
  std::fill(std::begin(map_), std::end(map_), int16_t{-1});
  std::memset(complement_, 0, sizeof complement_);
  auto accept = [&](unsigned char c, int id) {
    map_[c] = static_cast<int16_t>(id);
    alphabet_.ok[c] = true;
    max_id_ = std::max(max_id_, id);
  };
  if (name == "byte") {
    kind_ = Kind::Byte;
    alphabet_.name = "byte-level (letters, '*', '-')";
    for (int c = 'A'; c <= 'Z'; ++c) accept(c, c), accept(c - 'A' + 'a', uppercase ? c : c - 'A' + 'a');
    accept('*', '*');
    accept('-', '-');
  } else if (name == "nucleotide") {
    kind_ = Kind::Nucleotide;
    alphabet_.name = "nucleotide (IUPAC codes and '-')";
    for (int i = 0; kIupac[i]; ++i) {
      const unsigned char up = kIupac[i], lo = static_cast<unsigned char>(std::tolower(up));
      accept(up, up);
      accept(lo, uppercase ? up : lo);
      complement_[up] = static_cast<uint8_t>(kIupacComplement[i]);
      complement_[lo] = static_cast<uint8_t>(std::tolower(kIupacComplement[i]));
    }
    accept('-', '-');
    complement_[static_cast<unsigned char>('-')] = '-';
  } else if (name == "protein") {
    kind_ = Kind::Protein;
    alphabet_.name = "protein (amino-acid letters, '.', '-', a final '*')";
    for (int i = 0; kEsmResidues[i]; ++i) {
      const unsigned char c = kEsmResidues[i];
      accept(c, kEsmFirstResidue + i);
      if (std::isalpha(c)) accept(static_cast<unsigned char>(std::tolower(c)), kEsmFirstResidue + i);
    }
    accept('J', kEsmUnk);
    accept('j', kEsmUnk);
    alphabet_.ok['*'] = true;  // checked in encode: only as the last residue
    max_id_ = kEsmLast;
  } else {
    throw DataError("unknown tokenizer '" + name + "' (expected byte, nucleotide or protein)");
  }
}

char Tokenizer::residue_of(int32_t id) const {
  for (int c = 0; c < 256; ++c)
    if (map_[c] == id) return static_cast<char>(c);
  return 0;
}

std::string Tokenizer::encode(const SeqRecord& r, const std::string& prefix, std::vector<int32_t>& out) const {
  const std::string& s = r.seq;
  size_t n = s.size();
  if (kind_ == Kind::Protein) {
    if (n > 0 && s[n - 1] == '*') --n;  // a terminal stop codon symbol
    const size_t star = s.find('*');
    if (star < n)
      return prefix + ", " + r.where(static_cast<int64_t>(star)) + ": '*' (stop) at residue " +
             std::to_string(star + 1) + " of " + std::to_string(s.size()) +
             " is only accepted as the last residue";
  }
  const size_t at = out.size();
  out.resize(at + n);
  int32_t* o = out.data() + at;
  for (size_t i = 0; i < n; ++i) o[i] = map_[static_cast<unsigned char>(s[i])];  // readers checked the alphabet
  return "";
}

void Tokenizer::reverse_complement(int32_t* t, int64_t n) const {
  auto is_nt = [&](int32_t v) { return v >= 0 && v < 256 && complement_[v] != 0; };
  int64_t i = 0;
  while (i < n) {
    if (!is_nt(t[i])) {
      ++i;
      continue;
    }
    int64_t j = i;
    while (j < n && is_nt(t[j])) ++j;
    std::reverse(t + i, t + j);
    for (int64_t k = i; k < j; ++k) t[k] = complement_[t[k]];
    i = j;
  }
}

}  // namespace mxt::detail
