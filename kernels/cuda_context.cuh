#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <memory>

#include "mxtrain/trace.hpp"

namespace mxt {

// What every CUDA op shares: the device, the stream the whole step runs on, the cuBLASLt handle and its
// workspace (allocated once).
struct CudaContext {
  int device = 0;
  cudaStream_t stream = nullptr;
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  int num_sms = 0;
  int compute_capability = 0;  // major * 10 + minor (90 for Hopper)
  int sm_reserve = 0;  // left to a concurrent collective by the persistent GEMMs (set_sm_reserve)
  int gemm_sms() const { return num_sms - sm_reserve > 1 ? num_sms - sm_reserve : 1; }
  bool exchange_alongside = false;  // a collective may run beside the next kernels (set_exchange_alongside)
  std::unique_ptr<StageClock> clock;  // MXTRAIN_STAGE_TIMING=1 only (kernels/stage_clock.cu)
  size_t allocated = 0, peak = 0;  // bytes held through alloc() and scratch(), for the memory report
  void note_alloc(long long delta) {
    allocated = static_cast<size_t>(static_cast<long long>(allocated) + delta);
    if (allocated > peak) peak = allocated;
  }

  // Grow-only device scratch, one buffer per named slot, for ops that need temporary space (LM-head logits
  // chunk, attention row statistics...). Sized on the first step and then reused: no allocation in steady
  // state. Each op owns its slot names; a slot's content does not survive the op.
  void* scratch(const char* slot, size_t bytes);
  // The grouped GEMMs' split counters (a scratch slot whose content does survive: zero between launches), and the
  // buffer last zeroed for them.
  const void* split_counts_zeroed = nullptr;

  // Pinned host buffers that upload_async copies through, used round-robin; each is reused once the copy
  // that last read it has run (its event).
  // A pinned host buffer and the event after the copy that last used it.
  struct Staging {
    void* host = nullptr;
    size_t bytes = 0;
    cudaEvent_t done = nullptr;
    // Waits for the last copy through the buffer, then makes it hold at least `bytes`.
    void reserve(size_t bytes, const char* op);
    void release();  // at teardown
  };
  Staging staging[8];
  unsigned staging_next = 0;
  Staging readback;  // download_overlapped's pinned buffer and the event after its copy

  // A second stream for independent kernels that fill each other's idle SMs (the attention backward's dQ beside
  // its dK/dV): fork() returns it, ordered after the work queued on `stream` so far; join() orders `stream` after
  // the work queued on it since. Both are event records and waits, so they also work inside graph capture.
  cudaStream_t fork();
  void join();
  ~CudaContext();

 private:
  struct Slot { const char* name; void* ptr; size_t bytes; };
  Slot slots_[32] = {};
  cudaStream_t side_ = nullptr;
  cudaEvent_t fork_ev_ = nullptr, join_ev_ = nullptr;
};

}  // namespace mxt
