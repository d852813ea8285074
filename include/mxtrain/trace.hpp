#pragma once
// Named ranges on a profiler's timeline (NVTX on CUDA builds: Nsight Systems and Nsight Compute's --nvtx filters
// show the training step as the model's stages). Free when no profiler is attached; no-ops in CPU-only builds.
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

}  // namespace mxt
