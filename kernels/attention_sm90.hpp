#pragma once
// The Hopper wgmma attention backward kernels the flash dispatch tries first (attention_dkv_sm90.cu,
// attention_dq_sm90.cu).
#include <cuda_runtime.h>

#include "attention_common.cuh"

namespace mxt::cuda::attn {

struct BwdParams;

// dK and dV of the backward (after the prep kernel filled p.lse2 / p.delta) on `stream`; false, nothing
// launched, where the kernel does not apply (head_dim 128, no document mask, seq a multiple of 128, an sm_90a
// device) or MXTRAIN_ATTENTION_DKV=mma; MXTRAIN_ATTENTION_DKV=wgmma makes "does not apply" an error.
bool try_dkv_sm90(const Geom& G, const BwdParams& p, int device, cudaStream_t stream);
// dQ, the same way (MXTRAIN_ATTENTION_DQ=auto|wgmma|mma).
bool try_dq_sm90(const Geom& G, const BwdParams& p, int device, cudaStream_t stream);

}  // namespace mxt::cuda::attn
