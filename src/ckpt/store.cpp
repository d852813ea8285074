// The checkpoint directory: temporary directory per save, the commit (manifest last, fsync, rename),
// discovery of complete checkpoints and retention. Removals rename to *.trash first, so a kill in the middle
// of a removal never leaves a half-deleted step_<N> that looks like a checkpoint.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <filesystem>

#include "ckpt/ckpt_internal.hpp"

namespace mxt::ckpt {
namespace fs = std::filesystem;
namespace {

// "step_<digits>" -> N; -1 for anything else.
int64_t parse_step(const std::string& name) {
  if (name.rfind("step_", 0) != 0 || name.size() == 5 || name.size() > 5 + 18) return -1;
  for (size_t i = 5; i < name.size(); ++i)
    if (!std::isdigit(static_cast<unsigned char>(name[i]))) return -1;
  return std::stoll(name.substr(5));
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

void remove_dir(const fs::path& dir) {
  const fs::path trash = dir.string() + ".trash";
  std::error_code ec;
  fs::remove_all(trash, ec);
  fs::rename(dir, trash, ec);
  if (!ec) fs::remove_all(trash, ec);
  if (ec) spdlog::warn("checkpoint: could not remove {}: {}", dir.string(), ec.message());
}

}  // namespace

std::string step_dir_name(int64_t step) { return "step_" + std::to_string(step); }

void remove_leftovers(const std::string& ckpt_dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(ckpt_dir, ec)) {
    const std::string name = e.path().filename().string();
    if ((name.rfind("step_", 0) == 0 && ends_with(name, ".tmp")) || ends_with(name, ".trash")) {
      std::error_code rm;
      fs::remove_all(e.path(), rm);  // left by a save that was killed
      if (rm) spdlog::warn("checkpoint: could not remove stale {}: {}", e.path().string(), rm.message());
    }
  }
}

std::string prepare_tmp_dir(const std::string& ckpt_dir, int64_t step) {
  std::error_code ec;
  fs::create_directories(ckpt_dir, ec);
  if (ec) throw CheckpointError("checkpoint directory " + ckpt_dir + ": cannot create it: " + ec.message());
  remove_leftovers(ckpt_dir);
  const fs::path tmp = fs::path(ckpt_dir) / (step_dir_name(step) + ".tmp");
  fs::remove_all(tmp, ec);
  if (!fs::create_directory(tmp, ec) || ec)
    throw CheckpointError("checkpoint directory " + tmp.string() + ": cannot create it: " +
                          (ec ? ec.message() : std::string("exists")));
  return tmp.string();
}

std::string commit_dir(const std::string& ckpt_dir, const std::string& tmp_dir, const Manifest& m) {
  write_durable(tmp_dir + "/manifest.json", manifest_text(m));
  fsync_path(tmp_dir);
  const fs::path final_dir = fs::path(ckpt_dir) / step_dir_name(m.step);
  std::error_code ec;
  if (fs::exists(final_dir, ec)) {  // an older run's (or a corrupt) checkpoint of the same step
    spdlog::warn("checkpoint: replacing the existing {}", final_dir.string());
    remove_dir(final_dir);
  }
  fs::rename(tmp_dir, final_dir, ec);
  if (ec) throw CheckpointError("checkpoint directory " + tmp_dir + ": cannot rename it to " + final_dir.string() + ": " + ec.message());
  fsync_path(ckpt_dir);
  return final_dir.string();
}

std::vector<std::string> incomplete_step_dirs(const std::string& ckpt_dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(ckpt_dir, ec))
    if (parse_step(e.path().filename().string()) >= 0 && e.is_directory(ec) && !fs::exists(e.path() / "manifest.json", ec))
      out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

void prune_checkpoints(const std::string& ckpt_dir, int64_t keep, int64_t just_saved) {
  if (keep <= 0) return;
  int64_t kept = 1;  // just_saved
  for (const auto& [step, dir] : find_checkpoints(ckpt_dir)) {
    if (step == just_saved) continue;
    if (kept < keep) {
      ++kept;
      continue;
    }
    spdlog::info("checkpoint: removing {} (max_checkpoints={})", dir, keep);
    remove_dir(dir);
  }
}

}  // namespace mxt::ckpt

namespace mxt {

std::vector<std::pair<int64_t, std::string>> find_checkpoints(const std::string& ckpt_dir) {
  namespace fs = std::filesystem;
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(ckpt_dir, ec)) {
    const int64_t step = ckpt::parse_step(e.path().filename().string());
    if (step >= 0 && e.is_directory(ec) && fs::is_regular_file(e.path() / "manifest.json", ec))
      out.emplace_back(step, e.path().string());
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

}  // namespace mxt
