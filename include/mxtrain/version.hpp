// What the binary is: its version and the commit it was built from, printed by --version and logged at start,
// so a run's log names the code that made it.
#pragma once

#include <string>

#ifndef MXTRAIN_VERSION
#define MXTRAIN_VERSION "unknown"
#endif

namespace mxt {

// 12 hex digits of the source commit, with "-dirty" when tracked files differed from it; "unknown" when not
// built from a git checkout (generated at build time by cmake/build_commit.cmake).
const char* build_commit();

// "0.1.0 (commit 0123456789ab)"
inline std::string version_string() { return std::string(MXTRAIN_VERSION) + " (commit " + build_commit() + ")"; }

}  // namespace mxt
