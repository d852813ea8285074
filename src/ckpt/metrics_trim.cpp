// A resumed run appends to the metrics file: first drop the lines of steps after the checkpoint (the killed
// run logged them, the resumed run logs them again) and a torn last line.
#include <spdlog/spdlog.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "mxtrain/checkpoint.hpp"
#include "mxtrain/safetensors.hpp"

namespace mxt {

void truncate_metrics_after(const std::string& path, int64_t step) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return;
  std::string line, kept;
  int64_t dropped = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    const bool keep = j.is_object() && j.contains("step") && j["step"].is_number_integer() &&
                      j["step"].get<int64_t>() <= step;
    if (keep) kept += line + "\n";
    else ++dropped;
  }
  in.close();
  if (dropped == 0) return;
  try {
    write_file_atomic(path, kept);
  } catch (const std::exception& e) {
    throw CheckpointError("metrics file " + path + ": cannot rewrite it on resume: " + e.what());
  }
  spdlog::info("metrics: dropped {} lines after step {} from {}", dropped, step, path);
}

}  // namespace mxt
