// Shuffle, sharding and blending of units (see unit_order.hpp).
#include "data/unit_order.hpp"

#include <numeric>
#include <stdexcept>
#include <string>

#include "mxtrain/rng.hpp"

namespace mxt::detail {

namespace {
constexpr int64_t kPeriod = 1 << 16;  // blend schedule resolution: weights are honoured to 1/65536
}

UnitOrder::UnitOrder(std::vector<int64_t> units, std::vector<double> weights, bool shuffle, uint64_t seed, int rank,
                     int world)
    : units_(std::move(units)), shuffle_(shuffle), seed_(seed), rank_(rank), world_(world) {
  const int S = static_cast<int>(units_.size());
  if (S == 0 || S > 65535 || weights.size() != units_.size())
    throw std::invalid_argument("UnitOrder: " + std::to_string(S) + " sources, " + std::to_string(weights.size()) +
                                " weights");
  for (int64_t n : units_) {
    if (n < world) throw std::invalid_argument("UnitOrder: a source has fewer units than ranks");
    per_rank_.push_back(n / world);
    per_epoch_ += n / world;
  }
  cached_epoch_.assign(S, -1);
  cached_.resize(S);
  per_period_.assign(S, 0);
  if (S == 1) {
    src_ = {0};
    k_ = {0};
    per_period_ = {1};
    return;
  }
  const double total = std::accumulate(weights.begin(), weights.end(), 0.0);
  src_.resize(kPeriod);
  k_.resize(kPeriod);
  for (int64_t i = 0; i < kPeriod; ++i) {
    int best = 0;
    double best_gap = -1e300;
    for (int s = 0; s < S; ++s) {
      const double gap = weights[s] / total * static_cast<double>(i + 1) - static_cast<double>(per_period_[s]);
      if (gap > best_gap) best_gap = gap, best = s;
    }
    src_[i] = static_cast<uint16_t>(best);
    k_[i] = per_period_[best]++;
  }
  for (int s = 0; s < S; ++s)
    if (per_period_[s] == 0)
      throw std::invalid_argument("dataset.weights[" + std::to_string(s) + "] is below 1/" + std::to_string(kPeriod) +
                                  " of the total: the source would never be read");
}

int64_t UnitOrder::total_units() const { return std::accumulate(units_.begin(), units_.end(), int64_t{0}); }

const std::vector<int64_t>& UnitOrder::perm(int s, int64_t epoch) {
  std::vector<int64_t>& p = cached_[s];
  if (cached_epoch_[s] == epoch) return p;
  p.resize(static_cast<size_t>(units_[s]));
  std::iota(p.begin(), p.end(), int64_t{0});
  // Mix seed, source and epoch through splitmix64 so nearby values give unrelated permutations; source 0
  // reproduces the single-stream loader's order.
  SplitMix64 mix(seed_ ^ (static_cast<uint64_t>(s) * 0x9E3779B97F4A7C15ull));
  SplitMix64 rng(mix.next() ^ (static_cast<uint64_t>(epoch) * 0xD1B54A32D192ED03ull));
  rng.next();
  for (size_t i = p.size() - 1; i > 0; --i) std::swap(p[i], p[rng.below(i + 1)]);
  cached_epoch_[s] = epoch;
  return p;
}

UnitOrder::Ref UnitOrder::at(int64_t p) {
  const int64_t period = static_cast<int64_t>(src_.size());
  const int64_t slot = p % period;
  Ref r;
  r.src = src_[slot];
  const int64_t k = (p / period) * per_period_[r.src] + k_[slot];
  const int64_t m = per_rank_[r.src];
  r.src_epoch = k / m;
  const int64_t idx = rank_ + (k % m) * world_;
  r.unit = shuffle_ ? perm(r.src, r.src_epoch)[idx] : idx;
  return r;
}

}  // namespace mxt::detail
