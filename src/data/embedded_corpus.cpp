// The built-in corpus: a synthetic, bacterial-like genome generated at first use from a fixed seed, so the
// binary trains without any download and every machine sees the same bytes. It is FASTA-shaped text
// (">gene_N" header, sequence wrapped at 60 columns) with structure a small model can pick up at several
// scales: AT-rich intergenic background, promoter boxes (-35 TTGACA / -10 TATAAT), a Shine-Dalgarno site,
// an ATG-started ORF of codons drawn from a skewed usage table, shared "protein domains" reused across genes,
// a stop codon, a hairpin terminator (stem + loop + reverse complement + T-run) and repeated REP elements.
#include <string>
#include <vector>

#include "mxtrain/rng.hpp"
#include "mxtrain/data.hpp"

namespace mxt {
namespace {


constexpr uint64_t kSeed = 0x6D78747261696E31ull;  // "mxtrain1"
constexpr size_t kTargetBytes = 300000;             // stop after the record that crosses this
constexpr size_t kLineWidth = 60;

struct Weighted {
  const char* text;
  int weight;
};

// Sense codons with E. coli-like usage per thousand (rounded): strongly skewed, e.g. CTG >> CTA.
constexpr Weighted kCodons[] = {
    {"TTT", 22}, {"TTC", 16}, {"TTA", 14}, {"TTG", 13}, {"CTT", 11}, {"CTC", 11}, {"CTA", 4},  {"CTG", 52},
    {"ATT", 30}, {"ATC", 25}, {"ATA", 5},  {"ATG", 28}, {"GTT", 18}, {"GTC", 15}, {"GTA", 11}, {"GTG", 26},
    {"TCT", 9},  {"TCC", 9},  {"TCA", 7},  {"TCG", 9},  {"CCT", 7},  {"CCC", 5},  {"CCA", 8},  {"CCG", 23},
    {"ACT", 9},  {"ACC", 23}, {"ACA", 7},  {"ACG", 14}, {"GCT", 15}, {"GCC", 26}, {"GCA", 20}, {"GCG", 33},
    {"TAT", 16}, {"TAC", 12}, {"CAT", 13}, {"CAC", 10}, {"CAA", 15}, {"CAG", 29}, {"AAT", 18}, {"AAC", 22},
    {"AAA", 34}, {"AAG", 10}, {"GAT", 32}, {"GAC", 19}, {"GAA", 40}, {"GAG", 18}, {"TGT", 5},  {"TGC", 6},
    {"TGG", 15}, {"CGT", 21}, {"CGC", 22}, {"CGA", 4},  {"CGG", 5},  {"AGT", 9},  {"AGC", 16}, {"AGA", 2},
    {"AGG", 1},  {"GGT", 25}, {"GGC", 29}, {"GGA", 8},  {"GGG", 11},
};
constexpr Weighted kStops[] = {{"TAA", 64}, {"TGA", 29}, {"TAG", 7}};
constexpr Weighted kIntergenic[] = {{"A", 31}, {"T", 31}, {"G", 19}, {"C", 19}};  // AT-rich
constexpr Weighted kStem[] = {{"G", 35}, {"C", 35}, {"A", 15}, {"T", 15}};        // GC-rich hairpin stems
constexpr const char* kRepElement = "GCCGGATGCGGCGTGAACGCCTTATCCGGCCTAC";
constexpr const char* kLoops[] = {"GAAA", "TTCG", "GCAA"};
constexpr int kNumDomains = 12;

template <size_t N>
const char* pick(SplitMix64& rng, const Weighted (&table)[N]) {
  uint64_t total = 0;
  for (const auto& w : table) total += static_cast<uint64_t>(w.weight);
  uint64_t r = rng.below(total);
  for (const auto& w : table) {
    if (r < static_cast<uint64_t>(w.weight)) return w.text;
    r -= static_cast<uint64_t>(w.weight);
  }
  return table[N - 1].text;  // unreachable
}

char complement(char b) {
  switch (b) {
    case 'A': return 'T';
    case 'T': return 'A';
    case 'G': return 'C';
    default: return 'G';
  }
}

class GenomeWriter {
 public:
  explicit GenomeWriter(uint64_t seed) : rng_(seed) {
    // Domains are fixed codon runs that recur in many genes: long exact repeats reward copying.
    for (int d = 0; d < kNumDomains; ++d) {
      std::string dom;
      for (int64_t i = 0, n = rng_.range(12, 36); i < n; ++i) dom += pick(rng_, kCodons);
      domains_.push_back(dom);
    }
  }

  std::string build(size_t min_bytes) {
    std::string out;
    for (int gene = 1; out.size() < min_bytes; ++gene) {
      out += ">gene_" + std::to_string(gene) + "\n";
      const std::string seq = record();
      for (size_t i = 0; i < seq.size(); i += kLineWidth) out += seq.substr(i, kLineWidth) + "\n";
    }
    return out;
  }

 private:
  std::string record() {
    std::string s;
    intergenic(s, rng_.range(30, 120));
    box(s, "TTGACA");                     // -35 box
    intergenic(s, 17);                    // the canonical 17 bp spacer
    box(s, "TATAAT");                     // -10 box
    intergenic(s, rng_.range(5, 9));
    box(s, "AGGAGG");                     // ribosome binding site
    intergenic(s, rng_.range(6, 9));
    orf(s);
    terminator(s);
    intergenic(s, rng_.range(20, 80));
    return s;
  }

  void intergenic(std::string& s, int64_t len) {
    const bool rep = len >= 60 && rng_.below(4) == 0;
    const int64_t rep_at = rep ? rng_.range(0, len - 1) : -1;
    for (int64_t i = 0; i < len; ++i) {
      if (i == rep_at) s += kRepElement;
      s += pick(rng_, kIntergenic);
    }
  }

  // A consensus box, with one point mutation 15% of the time (real boxes are rarely perfect).
  void box(std::string& s, const char* consensus) {
    std::string b = consensus;
    if (rng_.below(100) < 15) b[rng_.below(b.size())] = "ACGT"[rng_.below(4)];
    s += b;
  }

  void orf(std::string& s) {
    s += "ATG";
    const int64_t codons = rng_.range(60, 300);
    const int64_t domains = static_cast<int64_t>(rng_.below(3));  // 0..2 shared domains per gene
    int64_t slot[2] = {rng_.range(0, codons - 1), rng_.range(0, codons - 1)};
    for (int64_t i = 0; i < codons; ++i) {
      for (int64_t d = 0; d < domains; ++d)
        if (slot[d] == i) s += domains_[rng_.below(kNumDomains)];
      s += pick(rng_, kCodons);
    }
    s += pick(rng_, kStops);
  }

  void terminator(std::string& s) {
    intergenic(s, rng_.range(4, 12));
    std::string stem;
    for (int64_t i = 0, n = rng_.range(7, 10); i < n; ++i) stem += pick(rng_, kStem);
    s += stem;
    s += kLoops[rng_.below(3)];
    for (auto it = stem.rbegin(); it != stem.rend(); ++it) s += complement(*it);
    s += "TTTTTTT";
  }

  SplitMix64 rng_;
  std::vector<std::string> domains_;
};

}  // namespace

std::vector<int32_t> embedded_corpus_tokens() {
  // Built once (thread-safe static); callers get their own copy.
  static const std::vector<int32_t> tokens = [] {
    const std::string text = GenomeWriter(kSeed).build(kTargetBytes);
    std::vector<int32_t> t;
    t.reserve(text.size());
    for (unsigned char c : text) t.push_back(static_cast<int32_t>(c));
    return t;
  }();
  return tokens;
}

}  // namespace mxt
