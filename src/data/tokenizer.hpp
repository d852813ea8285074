#pragma once
// Sequence tokenizers for FASTA/FASTQ records.
//   byte:       one token per residue, its byte value (any letter, '*', '-'); upper-cased unless told not to.
//               What dataset.source=fasta always did.
//   nucleotide: byte values like Evo2's byte-level tokenizer (ord(c)), but only IUPAC nucleotide codes
//               (A C G T U R Y S W K M B D H V N) and '-' gaps are accepted; upper-case optional (lower case
//               is the soft-masking of repeats).
//   protein:    ESM-2's ids: <cls>0 <pad>1 <eos>2 <unk>3, then L A G V S E R T I D P K Q N F Y M H W C (the 20
//               standard residues), X B U Z O (unknown, Asx, selenocysteine, Glx, pyrrolysine), '.' and '-'
//               (gaps), <null_1>31 <mask>32. Case-insensitive. J (Leu/Ile) has no ESM-2 token and reads as
//               <unk>. A '*' (stop) is allowed only as a record's last residue and dropped.
// Special tokens (BOS / EOS / SEP / PAD) are configured ids; they must not collide with residue ids.
#include <cstdint>
#include <string>
#include <vector>

#include "data/seq_reader.hpp"

namespace mxt::detail {

class Tokenizer {
 public:
  enum class Kind { Byte, Nucleotide, Protein };
  // name: byte | nucleotide | protein (DataError otherwise).
  Tokenizer(const std::string& name, bool uppercase);

  Kind kind() const { return kind_; }
  const std::string& name() const { return name_; }
  const Alphabet& alphabet() const { return alphabet_; }  // what the readers accept
  int32_t max_residue_id() const { return max_id_; }
  // The residue that token id stands for, or 0 if none (for collision messages).
  char residue_of(int32_t id) const;

  // Appends the tokens of r's residues to out. Returns "" or an error naming the record (a '*' that is not
  // the last residue of a protein).
  std::string encode(const SeqRecord& r, const std::string& prefix, std::vector<int32_t>& out) const;

  // Reverse complement in place of every run of nucleotide tokens in [t, t+n): each run is reversed and
  // complemented (A<->T, C<->G, U->A, IUPAC ambiguity codes to theirs, N->N, case kept); other tokens
  // (BOS/EOS/SEP) stay where they are.
  void reverse_complement(int32_t* t, int64_t n) const;

 private:
  Kind kind_;
  std::string name_;
  bool uppercase_;
  Alphabet alphabet_;
  int16_t map_[256];     // byte -> token id (-1: not accepted)
  int32_t max_id_ = 0;
  uint8_t complement_[256];  // nucleotide byte -> its complement (0: not a nucleotide)
};

}  // namespace mxt::detail
