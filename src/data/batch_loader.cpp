// Windowing, per-epoch shuffle and data-parallel sharding of one token stream.
//
// Windows: S = max_seq_length tokens starting at 0, step, 2*step, ... with step = S - stride, so consecutive
//   windows share `stride` tokens (HF tokenizers' overflow stride). Only full windows are kept: a partial
//   tail is dropped rather than padded (padding would train on fake tokens); at least one full window is
//   required. labels mirror HF causal LM: input_ids shifted by one inside the row, labels[S-1] = -100.
// Shuffle: a Fisher-Yates permutation of all windows from splitmix64(seed, epoch), the same on every rank
//   and platform; shuffle=false keeps corpus order.
// Sharding: rank r of w reads order[r], order[r+w], ... and exactly floor(n/w) windows per epoch (the
//   n mod w leftovers are skipped that epoch, like DistributedSampler's drop_last). Equal lengths keep
//   all ranks in the same epoch at the same step, so within an epoch their windows are disjoint.
#include <numeric>
#include <string>

#include "mxtrain/rng.hpp"
#include "mxtrain/data.hpp"

namespace mxt {

BatchLoader::BatchLoader(std::vector<int32_t> tokens, const DatasetConfig& cfg, uint64_t seed, int rank, int world)
    : tokens_(std::move(tokens)), cfg_(cfg), seed_(seed), rank_(rank), world_(world) {
  const int64_t S = cfg_.max_seq_length;
  if (S < 2) throw ConfigError("dataset.max_seq_length=" + std::to_string(S) + ": expected at least 2");
  if (cfg_.stride < 0 || cfg_.stride >= S)
    throw ConfigError("dataset.stride=" + std::to_string(cfg_.stride) + ": expected 0 <= stride < max_seq_length (" +
                      std::to_string(S) + ")");
  if (cfg_.micro_batch_size < 1)
    throw ConfigError("dataset.micro_batch_size=" + std::to_string(cfg_.micro_batch_size) + ": expected >= 1");
  if (world < 1 || rank < 0 || rank >= world)
    throw std::invalid_argument("BatchLoader: rank " + std::to_string(rank) + " of world " + std::to_string(world));

  const int64_t n_tokens = static_cast<int64_t>(tokens_.size());
  if (n_tokens < S)
    throw DataError("dataset has " + std::to_string(n_tokens) + " tokens, fewer than one window of " +
                    std::to_string(S));
  const int64_t step = S - cfg_.stride;
  for (int64_t s = 0; s + S <= n_tokens; s += step) starts_.push_back(s);
  if (num_windows() < world)
    throw DataError("dataset has " + std::to_string(num_windows()) + " windows of " + std::to_string(S) +
                    " tokens, fewer than the " + std::to_string(world) + " data-parallel ranks");
  reshuffle();
}

int64_t BatchLoader::windows_per_epoch() const { return num_windows() / world_; }

void BatchLoader::reshuffle() {
  order_.resize(starts_.size());
  std::iota(order_.begin(), order_.end(), int64_t{0});
  if (!cfg_.shuffle) return;
  // Mix seed and epoch through splitmix64 so nearby (seed, epoch) pairs give unrelated permutations.
  SplitMix64 mix(seed_);
  SplitMix64 rng(mix.next() ^ (static_cast<uint64_t>(epoch_) * 0xD1B54A32D192ED03ull));
  rng.next();
  for (size_t i = order_.size() - 1; i > 0; --i) std::swap(order_[i], order_[rng.below(i + 1)]);
}

void BatchLoader::next(Batch& out) {
  const int64_t S = cfg_.max_seq_length, B = cfg_.micro_batch_size;
  out.batch = B;
  out.seq = S;
  out.input_ids.resize(B * S);
  out.labels.resize(B * S);
  out.positions.resize(B * S);
  for (int64_t b = 0; b < B; ++b) {
    if (cursor_ >= windows_per_epoch()) {  // this rank's share is used up: next epoch, new order
      ++epoch_;
      cursor_ = 0;
      reshuffle();
    }
    const int64_t start = starts_[order_[rank_ + cursor_ * world_]];
    ++cursor_;
    const int32_t* w = tokens_.data() + start;
    int32_t* ids = out.input_ids.data() + b * S;
    int32_t* lab = out.labels.data() + b * S;
    int32_t* pos = out.positions.data() + b * S;
    for (int64_t i = 0; i < S; ++i) {
      ids[i] = w[i];
      lab[i] = i + 1 < S ? w[i + 1] : -100;
      pos[i] = static_cast<int32_t>(i);
    }
  }
}

void BatchLoader::set_position(int64_t epoch, int64_t cursor) {
  if (epoch < 0 || cursor < 0 || cursor > windows_per_epoch())
    throw DataError("BatchLoader::set_position(" + std::to_string(epoch) + ", " + std::to_string(cursor) +
                    "): cursor must be in [0, " + std::to_string(windows_per_epoch()) + "]");
  epoch_ = epoch;
  cursor_ = cursor;
  reshuffle();
}

}  // namespace mxt
