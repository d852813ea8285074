// CudaOps::attention_forward: causal GQA attention, bf16 in/out, fp32 softmax statistics (lse) and
// accumulation, optional document mask. Head dims 64 and 128 run the flash kernel
// (attention_flash_fwd.cuh), 16 and 32 (or MXTRAIN_ATTENTION=reference) the reference kernel; on Hopper, head_dim
// 128 without documents and seq a multiple of 128 runs the wgmma kernel (attention_fwd_sm90.cu) instead.
//
// Flash tile variants (MXTRAIN_ATTENTION_VARIANT), 128 query rows per block; all spill-free under ptxas:
//   0: 4 warps x 32 rows (FlashAttention-2's choice: each K/V fragment feeds two row blocks, 2.7 mma per
//      ldmatrix), K/V tiles of 32 keys for D=128, 64 for D=64 (larger tiles spill)
//   1: 8 warps x 16 rows (1.8 mma per ldmatrix, fewer registers), K/V tiles of 64 keys (D=128), 128 (D=64)
#include <cmath>

#include "attention_common.cuh"
#include "attention_flash_fwd.cuh"
#include "attention_reference.cuh"
#include "attention_sm90.hpp"
#include "cuda_context.cuh"
#include "cuda_ops.hpp"

namespace mxt {
namespace cuda::attn {

template <class Cfg>
void launch_fwd_flash(const Geom& G, const FwdParams& p, cudaStream_t stream) {
  const char* op = "attention_forward";
  static const bool smem_ok = (set_smem(attn_fwd_flash_kernel<Cfg>, Cfg::smem_bytes, op), true);
  (void)smem_ok;
  attn_fwd_flash_kernel<Cfg>
      <<<grid_1d(Cfg::grid(G.B, G.H, G.S), op), Cfg::NT, Cfg::smem_bytes, stream>>>(p);
  check_launch(op);
}

template <int D>
void run_fwd_flash(const Geom& G, const FwdParams& p, int variant, cudaStream_t stream) {
  if (variant == 0) launch_fwd_flash<FwdCfg<D, 2, D == 128 ? 32 : 64>>(G, p, stream);
  else launch_fwd_flash<FwdCfg<D, 1, D == 128 ? 64 : 128>>(G, p, stream);
}

template <int D>
void run_fwd_ref(const Geom& G, const ref::Params& p, cudaStream_t stream) {
  const char* op = "attention_forward";
  const size_t smem = ref::fwd_smem_bytes<D>();
  set_smem(ref::attn_fwd_ref_kernel<D>, smem, op);
  const dim3 grid((G.S + ref::kFwdBM - 1) / ref::kFwdBM, G.H, G.B);
  ref::attn_fwd_ref_kernel<D><<<grid, ref::kFwdThreads, smem, stream>>>(p);
  check_launch(op);
}

}  // namespace cuda::attn

void CudaOps::attention_forward(const AttnShape& s, const Tensor& q, const Tensor& k, const Tensor& v,
                                const Tensor& out, const Tensor& lse) {
  using namespace cuda::attn;
  const char* op = "attention_forward";
  const Geom G = check_geom(s, q, k, v, out, lse, op);
  const auto* qp = reinterpret_cast<const uint16_t*>(cuda::bf16p(q, op, "q"));
  const auto* kp = reinterpret_cast<const uint16_t*>(cuda::bf16p(k, op, "k"));
  const auto* vp = reinterpret_cast<const uint16_t*>(cuda::bf16p(v, op, "v"));
  auto* outp = reinterpret_cast<uint16_t*>(cuda::bf16p(out, op, "out"));
  float* lsep = cuda::f32(lse, op, "lse");
  if (G.T == 0) return;
  expect_aligned16(qp, op, "q");
  expect_aligned16(kp, op, "k");
  expect_aligned16(vp, op, "v");
  expect_aligned16(outp, op, "out");
  cudaStream_t st = ctx().stream;
  const float scale = 1.f / std::sqrt(static_cast<float>(G.D));

  if (use_flash(G.D, op)) {
    const FwdParams p{qp, kp, vp, outp, lsep, G.doc, G.B, G.S, G.H, G.KVH, scale * kLog2e};
    if (try_fwd_sm90(G, p, ctx().device, st)) return;
    const int variant = flash_variant(op);
    if (G.D == 64) run_fwd_flash<64>(G, p, variant, st);
    else run_fwd_flash<128>(G, p, variant, st);
    return;
  }
  ref::Params p{};
  p.q = qp;
  p.k = kp;
  p.v = vp;
  p.out = outp;
  p.lse = lsep;
  p.doc = G.doc;
  p.S = G.S;
  p.H = G.H;
  p.KVH = G.KVH;
  p.scale = scale;
  p.scale_log2 = scale * kLog2e;
  switch (G.D) {
    case 16: run_fwd_ref<16>(G, p, st); break;
    case 32: run_fwd_ref<32>(G, p, st); break;
    case 64: run_fwd_ref<64>(G, p, st); break;
    case 128: run_fwd_ref<128>(G, p, st); break;
    default: cuda::fail(op, "unsupported head_dim " + std::to_string(G.D));
  }
}

}  // namespace mxt
