#include "mxtrain/trace.hpp"

#include <cctype>
#include <cstring>

#if defined(MXTRAIN_HAVE_NVTX)
#include <nvtx3/nvToolsExt.h>
#endif

namespace mxt {

namespace {
StageClock* g_clock = nullptr;  // set once at backend start, used by the training thread only
}

void install_stage_clock(StageClock* clock) { g_clock = clock; }
StageClock* stage_clock() { return g_clock; }
void stage_mark(const char* op) {
  if (g_clock) g_clock->mark(op);
}

std::string stage_kind(const char* name) {
  std::string s(name);
  if (s.rfind("layer ", 0) == 0) {
    size_t i = 6;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
    if (i > 6 && i < s.size() && s[i] == ' ') s.erase(0, i + 1);
  }
  size_t j = s.size();
  while (j > 0 && std::isdigit(static_cast<unsigned char>(s[j - 1]))) --j;
  if (j < s.size() && j > 0 && s[j - 1] == ' ') s.erase(j - 1);
  return s;
}

#if defined(MXTRAIN_HAVE_NVTX)
TraceScope::TraceScope(const char* name) {
  nvtxRangePushA(name);
  if (g_clock) g_clock->begin(name);
}
TraceScope::~TraceScope() {
  if (g_clock) g_clock->end();
  nvtxRangePop();
}
#else
TraceScope::TraceScope(const char* name) {
  if (g_clock) g_clock->begin(name);
}
TraceScope::~TraceScope() {
  if (g_clock) g_clock->end();
}
#endif

}  // namespace mxt
