#pragma once
// Named ranges on a profiler's timeline (NVTX on CUDA builds: Nsight Systems and Nsight Compute's --nvtx filters
// show the training step as the model's stages). Free when no profiler is attached; no-ops in CPU-only builds.
//
// The same scopes feed an optional stage clock: with MXTRAIN_STAGE_TIMING=1 the CUDA backend installs one that
// brackets every scope with events on its stream, so the GPU time of each stage (compute, and the compute
// stream's waits for collectives and peers) is summed per stage name, layer numbers dropped, and logged per rank
// at the end of the run. This is how time inside a multi-GPU step is accounted for without a timeline profiler.
// MXTRAIN_STAGE_TIMING=ops also times every kernel launch of the CUDA ops (an event after each), summed per
// (innermost stage, op): a per-kernel account where ncu over a whole training run takes too long.
#include <string>

namespace mxt {

class TraceScope {
 public:
  explicit TraceScope(const char* name);
  explicit TraceScope(const std::string& name) : TraceScope(name.c_str()) {}
  ~TraceScope();
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;
};

class StageClock {
 public:
  virtual ~StageClock() = default;
  virtual void begin(const char* name) = 0;
  virtual void end() = 0;
  virtual void reset() = 0;                              // drop what was summed so far (e.g. the warm-up step)
  virtual void log(const std::string& who, int steps) = 0;  // per-stage totals and per-step means
  // A kernel (or library GEMM) of `op` was just enqueued on the backend's stream (op-level timing only).
  virtual void mark(const char* op) { (void)op; }
};
void install_stage_clock(StageClock* clock);  // nullptr uninstalls; the caller owns the clock
StageClock* stage_clock();                    // the installed one, or nullptr
// Called by the CUDA ops after each launch: forwards to the installed clock, if any.
void stage_mark(const char* op);
// "layer 12 moe backward" -> "moe backward", "micro_batch 3" -> "micro_batch": one row per kind of stage.
std::string stage_kind(const char* name);

}  // namespace mxt
