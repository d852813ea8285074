#pragma once
// The Hopper wgmma attention kernels the flash dispatch tries first (attention_fwd_sm90.cu,
// attention_dkv_sm90.cu, attention_dq_sm90.cu, attention_dq_ds_sm90.cu).
#include <cuda_runtime.h>

#include "attention_common.cuh"

namespace mxt::cuda::attn {

struct BwdParams;
struct FwdParams;

// The forward (out and lse) on `stream`; false, nothing launched, where the kernel does not apply (as for the
// backward kernels below) or MXTRAIN_ATTENTION_FWD=mma; MXTRAIN_ATTENTION_FWD=wgmma makes "does not apply" an
// error.
bool try_fwd_sm90(const Geom& G, const FwdParams& p, int device, cudaStream_t stream);

// dK and dV of the backward (after the prep kernel filled p.lse2 / p.delta) on `stream`; false, nothing
// launched, where the kernel does not apply (head_dim 128, no document mask, seq a multiple of 128, an sm_90a
// device) or MXTRAIN_ATTENTION_DKV=mma; MXTRAIN_ATTENTION_DKV=wgmma makes "does not apply" an error.
bool try_dkv_sm90(const Geom& G, const BwdParams& p, int device, cudaStream_t stream);
// dQ, the same way (MXTRAIN_ATTENTION_DQ=auto|wgmma|mma).
bool try_dq_sm90(const Geom& G, const BwdParams& p, int device, cudaStream_t stream);

// dQ from the dS tiles that the dK/dV kernel stores when p.ds is set (attention_dq_ds_sm90.cu): bwd_ds_bytes is
// the tiles' size where that path is taken, else 0 (MXTRAIN_ATTENTION_DS=auto|on|off; auto steps aside where the
// environment names a dK/dV or dQ kernel, on makes "does not apply" an error); launch_dq_ds_sm90 runs it after
// the dK/dV kernel on `stream`.
int64_t bwd_ds_bytes(const Geom& G, const BwdParams& p, int device);
void launch_dq_ds_sm90(const Geom& G, const BwdParams& p, cudaStream_t stream);

}  // namespace mxt::cuda::attn
