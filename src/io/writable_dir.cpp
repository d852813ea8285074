#include "mxtrain/writable_dir.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

namespace mxt {

std::string writable_dir_problem(const std::string& key, const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return fmt::format("{}={}: cannot create it: {}", key, dir, ec.message());
  const fs::path probe = fs::path(dir) / ".mxtrain_write_probe";
  FILE* f = std::fopen(probe.c_str(), "wb");
  const bool ok = f != nullptr && std::fputc('x', f) != EOF;
  const int err = errno;
  if (f) std::fclose(f);
  fs::remove(probe, ec);
  if (!ok) return fmt::format("{}={}: cannot write in it: {}", key, dir, std::strerror(err));
  return "";
}

}  // namespace mxt
