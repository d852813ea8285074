#pragma once
// The message of the exception a call throws, for tests that check what an error names.
#include <string>

namespace mxt::testing {

// The what() of the E that `f` throws, or `none` when it throws nothing (another exception type propagates).
template <class E, class F>
std::string thrown_message(F&& f, const std::string& none = "<nothing thrown>") {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return none;
}

}  // namespace mxt::testing
