#pragma once
#include <cuda_runtime.h>

#include <memory>

#include "mxtrain/trace.hpp"

namespace mxt {
// ops: also time each launch the CUDA ops mark (MXTRAIN_STAGE_TIMING=ops).
std::unique_ptr<StageClock> make_cuda_stage_clock(cudaStream_t stream, bool ops = false);
}
