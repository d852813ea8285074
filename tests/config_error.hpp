#pragma once
// The message of the ConfigError a call throws, for tests that check what an error names.
#include <string>

#include "mxtrain/config.hpp"
#include "thrown_message.hpp"

namespace mxt {

// The ConfigError message `f` throws, or a marker that it threw none.
template <class F>
std::string error_of(F&& f) {
  return testing::thrown_message<ConfigError>(f, "<no ConfigError thrown>");
}

}  // namespace mxt
