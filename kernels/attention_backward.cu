// CudaOps::attention_backward: flash-attention backward for causal GQA (bf16 in/out, fp32 accumulation),
// deterministic (no atomics), optional document mask. A prep kernel computes delta = rowsum(dO * O) and
// lse * log2(e) into scratch; then head dims 64 and 128 run the flash dQ and dK/dV kernels
// (attention_flash_bwd.cuh), 16 and 32 (or MXTRAIN_ATTENTION=reference) the reference kernels.
//
// Flash tile variants (MXTRAIN_ATTENTION_VARIANT); all spill-free under ptxas:
//   dQ, 128 query rows per block:   0: 4 warps x 32 rows, K/V tiles of 32 keys (2.4 mma per ldmatrix)
//                                   1: 8 warps x 16 rows, 64 keys (1.7)
//   dK/dV, keys per block:          0: D=64 4 warps x 32 keys, 32-row Q tiles (2.7); D=128 8 warps x 16 keys,
//                                      32-row Q tiles (1.6, 1 block per SM)
//                                   1: D=64 8 warps x 16 keys, 64-row Q tiles (1.8); D=128 4 warps x 16 keys,
//                                      32-row Q tiles (1.6, 2 blocks per SM)
// Before either, for head_dim 128 without a document mask and seq a multiple of 128, the wgmma kernels of
// attention_dkv_sm90.cu (also head_dim 64) and attention_dq_sm90.cu (MXTRAIN_ATTENTION_DKV / _DQ =
// auto|wgmma|mma); and before those, at head_dim 64 and 128 where its tiles fit (mxtrain/attention_ds.hpp), the
// wgmma dK/dV kernel storing dS and dQ made from it after it (attention_dq_ds_sm90.cu, MXTRAIN_ATTENTION_DS).
#include <cmath>

#include "attention_common.cuh"
#include "attention_flash_bwd.cuh"
#include "attention_reference.cuh"
#include "attention_sm90.hpp"
#include "cuda_context.cuh"
#include "cuda_ops.hpp"

namespace mxt {
namespace cuda::attn {

constexpr const char* kBwdOp = "attention_backward";

template <int D>
void launch_prep(const Geom& G, const BwdParams& p, cudaStream_t stream) {
  using Cfg = PrepCfg<D>;
  attn_bwd_prep_kernel<D><<<grid_1d(Cfg::grid(G.T * G.H), kBwdOp), Cfg::NT, 0, stream>>>(p);
  check_launch(kBwdOp);
}

template <class Cfg>
void launch_dq(const Geom& G, const BwdParams& p, cudaStream_t stream) {
  static const bool smem_ok = (set_smem(attn_bwd_dq_flash_kernel<Cfg>, Cfg::smem_bytes, kBwdOp), true);
  (void)smem_ok;
  attn_bwd_dq_flash_kernel<Cfg>
      <<<grid_1d(Cfg::grid(G.B, G.H, G.S), kBwdOp), Cfg::NT, Cfg::smem_bytes, stream>>>(p);
  check_launch(kBwdOp);
}

template <class Cfg>
void launch_dkv(const Geom& G, const BwdParams& p, cudaStream_t stream) {
  static const bool smem_ok = (set_smem(attn_bwd_dkv_flash_kernel<Cfg>, Cfg::smem_bytes, kBwdOp), true);
  (void)smem_ok;
  attn_bwd_dkv_flash_kernel<Cfg>
      <<<grid_1d(Cfg::grid(G.B, G.KVH, G.S), kBwdOp), Cfg::NT, Cfg::smem_bytes, stream>>>(p);
  check_launch(kBwdOp);
}

// dK/dV first on the op stream (its blocks, the first key tiles heaviest, take the SMs first), dQ beside it on
// the side stream when `concurrent`: the two kernels are independent, and each fills the SMs the other's causal
// tail leaves idle.
// dK/dV: the Hopper wgmma kernel where it applies (attention_dkv_sm90.cu), else the mma.sync one.
template <class DkvC>
void run_dkv(const Geom& G, const BwdParams& p, CudaContext& c) {
  if (!try_dkv_sm90(G, p, c.device, c.stream)) launch_dkv<DkvC>(G, p, c.stream);
}

// dQ likewise (attention_dq_sm90.cu), on `stream`.
template <class DqC>
void run_dq(const Geom& G, const BwdParams& p, CudaContext& c, cudaStream_t stream) {
  if (!try_dq_sm90(G, p, c.device, stream)) launch_dq<DqC>(G, p, stream);
}

template <class DqC, class DkvC>
void run_bwd_pair(const Geom& G, const BwdParams& p, CudaContext& c, bool concurrent) {
  if (!concurrent) {
    run_dq<DqC>(G, p, c, c.stream);
    run_dkv<DkvC>(G, p, c);
    return;
  }
  cudaStream_t side = c.fork();
  run_dkv<DkvC>(G, p, c);
  run_dq<DqC>(G, p, c, side);
  c.join();
}

template <int D>
void run_bwd_flash(const Geom& G, const BwdParams& p, int variant, CudaContext& c, bool concurrent) {
  if constexpr (D == 64) {
    if (variant == 0) run_bwd_pair<DqCfg<D, 2, 32>, DkvCfg<D, 2, 4, 32>>(G, p, c, concurrent);
    else run_bwd_pair<DqCfg<D, 1, 64>, DkvCfg<D, 1, 8, 64>>(G, p, c, concurrent);
  } else {
    if (variant == 0) run_bwd_pair<DqCfg<D, 2, 32>, DkvCfg<D, 1, 8, 32>>(G, p, c, concurrent);
    else run_bwd_pair<DqCfg<D, 1, 64>, DkvCfg<D, 1, 4, 32>>(G, p, c, concurrent);
  }
}

template <int D>
void run_bwd_ref(const Geom& G, const ref::Params& p, cudaStream_t stream) {
  const size_t smem_dq = ref::dq_smem_bytes<D>();
  set_smem(ref::attn_bwd_dq_ref_kernel<D>, smem_dq, kBwdOp);
  const dim3 grid_dq((G.S + ref::kDqBM - 1) / ref::kDqBM, G.H, G.B);
  ref::attn_bwd_dq_ref_kernel<D><<<grid_dq, ref::kBwdThreads, smem_dq, stream>>>(p);
  check_launch(kBwdOp);

  const size_t smem_dkv = ref::dkv_smem_bytes<D>();
  set_smem(ref::attn_bwd_dkv_ref_kernel<D>, smem_dkv, kBwdOp);
  const dim3 grid_dkv((G.S + ref::kDkvBN - 1) / ref::kDkvBN, G.KVH, G.B);
  ref::attn_bwd_dkv_ref_kernel<D><<<grid_dkv, ref::kBwdThreads, smem_dkv, stream>>>(p);
  check_launch(kBwdOp);
}

}  // namespace cuda::attn

void CudaOps::attention_backward(const AttnShape& s, const Tensor& dout, const Tensor& q, const Tensor& k,
                                 const Tensor& v, const Tensor& out, const Tensor& lse, const Tensor& dq,
                                 const Tensor& dk, const Tensor& dv) {
  using namespace cuda::attn;
  const char* op = kBwdOp;
  const Geom G = check_geom(s, q, k, v, out, lse, op);
  cuda::expect_numel(dout, G.T * G.H * G.D, op, "dout");
  cuda::expect_numel(dq, G.T * G.H * G.D, op, "dq");
  cuda::expect_numel(dk, G.T * G.KVH * G.D, op, "dk");
  cuda::expect_numel(dv, G.T * G.KVH * G.D, op, "dv");
  BwdParams p{};
  p.dout = reinterpret_cast<const uint16_t*>(cuda::bf16p(dout, op, "dout"));
  p.q = reinterpret_cast<const uint16_t*>(cuda::bf16p(q, op, "q"));
  p.k = reinterpret_cast<const uint16_t*>(cuda::bf16p(k, op, "k"));
  p.v = reinterpret_cast<const uint16_t*>(cuda::bf16p(v, op, "v"));
  p.out = reinterpret_cast<const uint16_t*>(cuda::bf16p(out, op, "out"));
  p.lse = cuda::f32(lse, op, "lse");
  p.dq = reinterpret_cast<uint16_t*>(cuda::bf16p(dq, op, "dq"));
  p.dk = reinterpret_cast<uint16_t*>(cuda::bf16p(dk, op, "dk"));
  p.dv = reinterpret_cast<uint16_t*>(cuda::bf16p(dv, op, "dv"));
  if (G.T == 0) return;
  expect_aligned16(p.dout, op, "dout");
  expect_aligned16(p.q, op, "q");
  expect_aligned16(p.k, op, "k");
  expect_aligned16(p.v, op, "v");
  expect_aligned16(p.out, op, "out");
  expect_aligned16(p.dq, op, "dq");
  expect_aligned16(p.dk, op, "dk");
  expect_aligned16(p.dv, op, "dv");
  p.doc = G.doc;
  p.B = G.B;
  p.S = G.S;
  p.H = G.H;
  p.KVH = G.KVH;
  p.scale = 1.f / std::sqrt(static_cast<float>(G.D));
  p.scale_log2 = p.scale * kLog2e;

  cudaStream_t st = ctx().stream;
  const size_t rows = static_cast<size_t>(G.T) * G.H;
  float* stats = static_cast<float*>(ctx().scratch("attn_bwd_stats", 2 * rows * sizeof(float)));
  p.delta = stats;
  p.lse2 = stats + rows;
  switch (G.D) {
    case 16: launch_prep<16>(G, p, st); break;
    case 32: launch_prep<32>(G, p, st); break;
    case 64: launch_prep<64>(G, p, st); break;
    case 128: launch_prep<128>(G, p, st); break;
    default: cuda::fail(op, "unsupported head_dim " + std::to_string(G.D));
  }

  if (use_flash(G.D, op)) {
    if (const int64_t ds_bytes = bwd_ds_bytes(G, p, ctx().device)) {
      p.ds = static_cast<uint16_t*>(ctx().scratch("attn_bwd_ds", static_cast<size_t>(ds_bytes)));
      if (!try_dkv_sm90(G, p, ctx().device, st)) cuda::fail(op, "the dS tiles need the wgmma dK/dV kernel");
      launch_dq_ds_sm90(G, p, st);
      return;
    }
    const int variant = flash_variant(op);
    const bool concurrent = bwd_concurrent(op);
    if (G.D == 64) run_bwd_flash<64>(G, p, variant, ctx(), concurrent);
    else run_bwd_flash<128>(G, p, variant, ctx(), concurrent);
    return;
  }
  ref::Params r{};
  r.q = p.q;
  r.k = p.k;
  r.v = p.v;
  r.dout = p.dout;
  r.lse_in = p.lse;
  r.delta = p.delta;
  r.dq = p.dq;
  r.dk = p.dk;
  r.dv = p.dv;
  r.doc = G.doc;
  r.S = G.S;
  r.H = G.H;
  r.KVH = G.KVH;
  r.scale = p.scale;
  r.scale_log2 = p.scale_log2;
  switch (G.D) {
    case 16: run_bwd_ref<16>(G, r, st); break;
    case 32: run_bwd_ref<32>(G, r, st); break;
    case 64: run_bwd_ref<64>(G, r, st); break;
    case 128: run_bwd_ref<128>(G, r, st); break;
    default: cuda::fail(op, "unsupported head_dim " + std::to_string(G.D));
  }
}

}  // namespace mxt
