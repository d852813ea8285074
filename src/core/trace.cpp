#include "mxtrain/trace.hpp"

#if defined(MXTRAIN_HAVE_NVTX)
#include <nvtx3/nvToolsExt.h>
#endif

namespace mxt {

#if defined(MXTRAIN_HAVE_NVTX)
TraceScope::TraceScope(const char* name) { nvtxRangePushA(name); }
TraceScope::~TraceScope() { nvtxRangePop(); }
#else
TraceScope::TraceScope(const char*) {}
TraceScope::~TraceScope() {}
#endif

}  // namespace mxt
