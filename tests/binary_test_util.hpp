#pragma once
// Running the mxtrain executable from a test: exit code and the combined stdout + stderr.
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace mxt::testing {

struct RunResult {
  int exit_code;
  std::string output;  // stdout + stderr
};

inline RunResult run_mxtrain(const std::string& args) {
  const std::string cmd = std::string(MXTRAIN_BINARY) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf{};
  while (size_t n = fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

}  // namespace mxt::testing
