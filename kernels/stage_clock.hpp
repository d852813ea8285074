#pragma once
#include <cuda_runtime.h>

#include <memory>

#include "mxtrain/trace.hpp"

namespace mxt {
std::unique_ptr<StageClock> make_cuda_stage_clock(cudaStream_t stream);
}
