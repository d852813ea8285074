#pragma once
// The Hopper wgmma attention backward kernels the flash dispatch tries first (attention_dkv_sm90.cu,
// attention_dq_sm90.cu): which of them run for one call, decided once, and their launches.
#include <cuda.h>
#include <cuda_runtime.h>

#include "attention_common.cuh"

namespace mxt::cuda::attn {

struct BwdParams;

// q / k / v / dout as [rows = B*S][heads * 128] bf16, read in [64][64] boxes.
struct TMaps {
  CUtensorMap q, k, v, dout;
};

struct Sm90Bwd {
  bool dkv = false, dq = false;  // run the wgmma dK/dV, dQ kernel
  TMaps maps{};
};

// From MXTRAIN_ATTENTION_DKV / MXTRAIN_ATTENTION_DQ (auto: where the kernels apply, wgmma: required, an error
// naming why where they do not, mma: never) and whether they apply: head_dim 128, no document mask, seq a
// multiple of 128, an sm_90a device and binary. The tensor maps are made once, for both kernels.
Sm90Bwd plan_bwd_sm90(const Geom& G, const BwdParams& p, int device);
// After the prep kernel filled p.lse2 / p.delta; only where plan_bwd_sm90 said so.
void launch_dkv_sm90(const Geom& G, const BwdParams& p, const TMaps& maps, cudaStream_t stream);
void launch_dq_sm90(const Geom& G, const BwdParams& p, const TMaps& maps, cudaStream_t stream);

}  // namespace mxt::cuda::attn
