#pragma once
// Helpers for the data-pipeline tests: a temp dir per test, plain and gzip files, expected errors.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "mxtrain/data.hpp"
#include "thrown_message.hpp"

namespace dtest {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "mxtrain_data_XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    dir_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string write(const std::string& name, const std::string& bytes) const {
    const std::string p = path(name);
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }
  // gzip-compressed; `members` > 1 writes the text as that many concatenated gzip members.
  std::string write_gz(const std::string& name, const std::string& text, int members = 1) const {
    const std::string p = path(name);
    std::ofstream(p, std::ios::binary).close();
    const size_t step = (text.size() + members - 1) / std::max(members, 1);
    for (int m = 0; m < members; ++m) {
      gzFile f = gzopen(p.c_str(), "ab");
      const size_t at = std::min(text.size(), m * step), n = std::min(step, text.size() - at);
      if (n) gzwrite(f, text.data() + at, static_cast<unsigned>(n));
      gzclose(f);
    }
    return p;
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string str() const { return dir_.string(); }

 private:
  fs::path dir_;
};

inline std::string read_bytes(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Runs f, expects a DataError and returns its message (so tests can check what it names).
template <class F>
std::string data_error(F&& f) {
  const std::string none = "<no DataError thrown>";
  const std::string m = mxt::testing::thrown_message<mxt::DataError>(f, none);
  if (m != none) return m;
  ADD_FAILURE() << "expected a DataError";
  return "";
}

inline std::vector<int32_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }

}  // namespace dtest
