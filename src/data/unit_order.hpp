#pragma once
// The order in which a rank reads units (windows or document chunks) of several sources.
//
// Per source s with n_s units: a Fisher-Yates permutation per source epoch from splitmix64(seed, s, epoch)
// (source 0 draws exactly what the single-stream loader always drew); rank r of w reads perm[r], perm[r+w],
// ..., m_s = floor(n_s / w) units per source epoch (DistributedSampler's drop_last), so all ranks are in the
// same source epoch at the same step and never share a unit within it.
// Blending: the rank's k-th read comes from the source a fixed schedule names: over a period of P reads,
// source s gets round(w_s P) slots, placed greedily so that every prefix is as close to the weights as it can
// be (Megatron's BlendedDataset rule: pick the source furthest behind its share). The schedule does not
// depend on the rank, so every rank reads the same source at the same step.
// Everything is a pure function of (seed, read index): resume is exact and costs nothing.
#include <cstdint>
#include <vector>

namespace mxt::detail {

class UnitOrder {
 public:
  struct Ref {
    int src = 0;
    int64_t unit = 0;       // index among the source's units
    int64_t src_epoch = 0;  // the source's own epoch (for per-epoch augmentation draws)
  };
  // units[s] >= world for every source (checked by the caller, which can name the source).
  UnitOrder(std::vector<int64_t> units, std::vector<double> weights, bool shuffle, uint64_t seed, int rank,
            int world);
  // Reads per "epoch": the sum of m_s. With one source, an epoch is exactly one pass over its m_0 units.
  int64_t per_epoch() const { return per_epoch_; }
  int64_t total_units() const;
  // The rank's read number p (0-based, over all epochs). Caches one permutation per source: one owner only.
  Ref at(int64_t p);

 private:
  const std::vector<int64_t>& perm(int s, int64_t epoch);
  std::vector<int64_t> units_, per_rank_;
  bool shuffle_;
  uint64_t seed_;
  int rank_, world_;
  int64_t per_epoch_ = 0;
  // The blend schedule over one period: slot i reads source src_[i], its k_[i]-th read of the period.
  std::vector<uint16_t> src_;
  std::vector<int64_t> k_, per_period_;
  // Cached permutations.
  std::vector<int64_t> cached_epoch_;
  std::vector<std::vector<int64_t>> cached_;
};

}  // namespace mxt::detail
