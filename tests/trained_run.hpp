#pragma once
// Trains a config to the end on the given ops and keeps what runs are compared by: per-step losses and the final
// fp32 master weights.
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include "mxtrain/data.hpp"
#include "mxtrain/ops.hpp"
#include "mxtrain/trainer.hpp"

namespace mxt::testing {

struct TrainedRun {
  std::vector<double> losses;
  std::vector<float> dense, expert;
};

// What a Trainer for c logs while it is set up on the CPU backend (warnings about the config, the plan).
inline std::string startup_log(const TrainConfig& c) {
  std::ostringstream out;
  auto saved = spdlog::default_logger();
  spdlog::set_default_logger(
      std::make_shared<spdlog::logger>("startup_log", std::make_shared<spdlog::sinks::ostream_sink_mt>(out)));
  {
    auto ops = make_cpu_ops();
    Trainer t(c, *ops, embedded_corpus_tokens());
  }
  spdlog::set_default_logger(saved);
  return out.str();
}

inline TrainedRun train_to_end(const TrainConfig& c, Ops& ops) {
  Trainer t(c, ops, embedded_corpus_tokens());
  TrainedRun r;
  r.losses = t.run();
  t.master_weights(r.dense, r.expert);
  return r;
}

}  // namespace mxt::testing
