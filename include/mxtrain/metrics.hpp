#pragma once
// Training logs: a human line through spdlog and a JSON-lines metrics file beside it.
#include <cstdint>
#include <cstdio>
#include <string>

namespace mxt {

struct StepMetrics {
  int64_t step = 0, total_steps = 0;
  double loss = 0, lr = 0, grad_norm = 0, aux_loss = 0;
  double tokens_per_s = 0, elapsed_s = 0, eta_s = 0;
  int64_t tokens = 0;  // tokens consumed so far
  double flops_per_s_per_rank = 0;  // model FLOPs (model_flops_per_token) per second and rank
};

// One held-out evaluation (validation.jsonl).
struct ValidationMetrics {
  int64_t step = 0;
  double loss = 0;
  int64_t tokens = 0;
  double seconds = 0;
};

class MetricsLog {
 public:
  // path empty: no file. The file is truncated unless append is set (resume).
  explicit MetricsLog(const std::string& path, bool append = false);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;
  void log(const StepMetrics& m);  // one console line (spdlog) + one JSON line (flushed)
  void log(const ValidationMetrics& m);
 private:
  void write_line(const std::string& json);
  FILE* f_ = nullptr;
};

std::string format_duration(double seconds);  // "1h02m03s", "4m05s", "12s"

}  // namespace mxt
