// Training log: a readable console line through spdlog and a machine-readable JSON line per logged step
// (flushed at once, so a crashed or killed run still leaves every step it logged, and a tail -f works).
#include "mxtrain/metrics.hpp"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

namespace mxt {
namespace {

std::string format_rate(double tok_per_s) {
  if (!std::isfinite(tok_per_s)) return "?";
  if (tok_per_s >= 1e6) return fmt::format("{:.2f}M", tok_per_s / 1e6);
  if (tok_per_s >= 1e3) return fmt::format("{:.1f}k", tok_per_s / 1e3);
  return fmt::format("{:.0f}", tok_per_s);
}

// Model FLOP/s in the unit that fits: "473.7 TFLOP/s", "12.3 GFLOP/s" (a CPU run).
std::string format_flops(double flops_per_s) {
  if (!std::isfinite(flops_per_s)) return "? FLOP/s";
  if (flops_per_s >= 1e12) return fmt::format("{:.1f} TFLOP/s", flops_per_s / 1e12);
  return fmt::format("{:.1f} GFLOP/s", flops_per_s / 1e9);
}

}  // namespace

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<int64_t>(std::llround(seconds));
  const int64_t h = s / 3600, m = s / 60 % 60, sec = s % 60;
  if (h > 0) return fmt::format("{}h{:02d}m{:02d}s", h, m, sec);
  if (m > 0) return fmt::format("{}m{:02d}s", m, sec);
  return fmt::format("{}s", sec);
}

MetricsLog::MetricsLog(const std::string& path, bool append) {
  if (path.empty()) return;
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  if (ec) throw std::runtime_error("cannot create the directory of metrics file '" + path + "': " + ec.message());
  f_ = std::fopen(path.c_str(), append ? "a" : "w");
  if (!f_) throw std::runtime_error("cannot open metrics file '" + path + "': " + std::strerror(errno));
}

MetricsLog::~MetricsLog() {
  if (f_) std::fclose(f_);
}

void MetricsLog::log(const StepMetrics& m) {
  std::string line = fmt::format("step {}/{} | loss {:.4f} | lr {:.2e} | grad_norm {:.3f}", m.step, m.total_steps,
                                 m.loss, m.lr, m.grad_norm);
  if (m.aux_loss != 0) line += fmt::format(" | aux_loss {:.4f}", m.aux_loss);  // only MoE runs with a coef
  line += fmt::format(" | {} tok/s | {} per rank | elapsed {} | eta {}", format_rate(m.tokens_per_s),
                      format_flops(m.flops_per_s_per_rank), format_duration(m.elapsed_s), format_duration(m.eta_s));
  spdlog::info(line);
  if (!f_) return;

  // Keys in the documented order; nlohmann writes non-finite numbers (a diverged loss) as null, so the line
  // stays valid JSON.
  const nlohmann::ordered_json j = {
      {"step", m.step},           {"total_steps", m.total_steps}, {"loss", m.loss},
      {"lr", m.lr},               {"grad_norm", m.grad_norm},     {"aux_loss", m.aux_loss},
      {"tokens", m.tokens},       {"tokens_per_s", m.tokens_per_s}, {"elapsed_s", m.elapsed_s},
      {"eta_s", m.eta_s},         {"tflops_per_rank", m.flops_per_s_per_rank / 1e12}};
  write_line(j.dump());
}

void MetricsLog::log(const ValidationMetrics& m) {
  spdlog::info("validation at step {}: loss {:.4f} | perplexity {:.3f} | {} tokens in {:.2f} s", m.step, m.loss,
               std::exp(m.loss), m.tokens, m.seconds);
  if (!f_) return;
  const nlohmann::ordered_json j = {{"step", m.step}, {"val_loss", m.loss}, {"val_perplexity", std::exp(m.loss)},
                                    {"tokens", m.tokens}, {"seconds", m.seconds}};
  write_line(j.dump());
}

void MetricsLog::write_line(const std::string& json) {
  const std::string text = json + "\n";
  if (std::fputs(text.c_str(), f_) == EOF || std::fflush(f_) != 0)
    spdlog::warn("writing the metrics file failed: {}", std::strerror(errno));
}

}  // namespace mxt
