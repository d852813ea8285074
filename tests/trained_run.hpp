#pragma once
// Trains a config to the end on the given ops and keeps what runs are compared by: per-step losses and the final
// fp32 master weights.
#include <vector>

#include "mxtrain/data.hpp"
#include "mxtrain/ops.hpp"
#include "mxtrain/trainer.hpp"

namespace mxt::testing {

struct TrainedRun {
  std::vector<double> losses;
  std::vector<float> dense, expert;
};

inline TrainedRun train_to_end(const TrainConfig& c, Ops& ops) {
  Trainer t(c, ops, embedded_corpus_tokens());
  TrainedRun r;
  r.losses = t.run();
  t.master_weights(r.dense, r.expert);
  return r;
}

}  // namespace mxt::testing
