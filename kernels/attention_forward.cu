// CudaOps::attention_forward: causal GQA flash attention (bf16 in/out, fp32 softmax statistics and
// accumulation, tensor-core mma.sync m16n8k16 for Q K^T and P V). Never forms an S x S matrix: a block owns
// 64 query rows of one (batch, head) and streams 64-key K/V tiles through shared memory with an online
// softmax held in registers.
#include <cmath>

#include "attention_common.cuh"
#include "cuda_context.cuh"
#include "cuda_ops.hpp"

namespace mxt {
namespace cuda::attn {

constexpr int kFwdBM = 64;       // query rows per block (4 warps x 16)
constexpr int kFwdBN = 64;       // keys per K/V tile
constexpr int kFwdThreads = 128;

template <int D>
constexpr size_t fwd_smem_bytes() {
  return static_cast<size_t>(2 * kFwdBN * (D + 8)) * sizeof(uint16_t);  // K tile + V tile
}

// grid (ceil(S/64), H, B). Query row r of head h in batch b: q[((b*S + r) * H + h) * D + d].
template <int D>
__global__ void __launch_bounds__(kFwdThreads, 1) attn_fwd_kernel(const bf16* __restrict__ q,
                                                               const bf16* __restrict__ k,
                                                               const bf16* __restrict__ v, bf16* __restrict__ out,
                                                               float* __restrict__ lse, int S, int H, int KVH,
                                                               float scale_log2) {
  constexpr int BM = kFwdBM, BN = kFwdBN, LD = D + 8;
  constexpr int KD = D / 16;  // k-steps over head_dim
  constexpr int ND = D / 8;   // n8 tiles over head_dim
  constexpr int NS = BN / 8;  // n8 tiles over the keys of a tile
  extern __shared__ __align__(16) uint16_t smem[];
  uint16_t* Ks = smem;
  uint16_t* Vs = smem + BN * LD;

  const int qt = gridDim.x - 1 - blockIdx.x;  // longest (last) query tiles first
  const int h = blockIdx.y, b = blockIdx.z;
  const int kvh = h / (H / KVH);
  const int q0 = qt * BM;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, c = lane % 4;

  const int64_t q_stride = static_cast<int64_t>(H) * D;
  const int64_t kv_stride = static_cast<int64_t>(KVH) * D;
  const bf16* qb = q + static_cast<int64_t>(b) * S * q_stride + static_cast<int64_t>(h) * D;
  const bf16* kb = k + static_cast<int64_t>(b) * S * kv_stride + static_cast<int64_t>(kvh) * D;
  const bf16* vb = v + static_cast<int64_t>(b) * S * kv_stride + static_cast<int64_t>(kvh) * D;

  // This thread's two query rows (C layout rows g and g+8 of the warp's 16).
  const int row[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};

  // Q fragments straight from global (zero past S), kept in registers for the whole key loop.
  uint32_t qa[KD][4];
#pragma unroll
  for (int kk = 0; kk < KD; ++kk) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = row[i & 1];
      const int col = kk * 16 + (i >> 1) * 8 + 2 * c;
      qa[kk][i] = r < S ? *reinterpret_cast<const uint32_t*>(qb + static_cast<int64_t>(r) * q_stride + col) : 0u;
    }
  }

  float o[ND][4];
#pragma unroll
  for (int j = 0; j < ND; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY};  // running max of the scaled scores, log2 units
  float l[2] = {0.f, 0.f};              // this thread's partial row sums (its 2 columns of each n8 tile)

  const int n_end = min(S, q0 + BM);  // causal: keys past the tile's last query are never needed
  for (int n0 = 0; n0 < n_end; n0 += BN) {
    __syncthreads();  // previous tile fully consumed
    load_tile<D, LD>(Ks, kb, kv_stride, n0, BN, S, tid, kFwdThreads);
    load_tile<D, LD>(Vs, vb, kv_stride, n0, BN, S, tid, kFwdThreads);
    __syncthreads();

    // S = Q K^T for the warp's 16 rows x BN keys.
    float s[NS][4];
#pragma unroll
    for (int j = 0; j < NS; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < KD; ++kk) {
#pragma unroll
      for (int j = 0; j < NS; ++j) {
        uint32_t b0, b1;
        load_b_t(b0, b1, Ks, LD, j * 8, kk * 16, g, c);
        mma16816(s[j], qa[kk], b0, b1);
      }
    }

    // Scale, causal mask, online softmax.
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < NS; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = n0 + j * 8 + 2 * c + (e & 1);
        const int r = row[e >> 1];
        const float val = (key <= r && key < S) ? s[j][e] * scale_log2 : -INFINITY;
        s[j][e] = val;
        mx[e >> 1] = fmaxf(mx[e >> 1], val);
      }
    }
    float alpha[2], base[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
      const float m_new = fmaxf(m[i], mx[i]);
      base[i] = m_new == -INFINITY ? 0.f : m_new;  // a row with nothing unmasked yet stays at zero weight
      alpha[i] = exp2f(m[i] - base[i]);            // exp2(-inf) = 0 on the first contribution
      m[i] = m_new;
      l[i] *= alpha[i];
    }
#pragma unroll
    for (int j = 0; j < NS; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = exp2f(s[j][e] - base[e >> 1]);
        s[j][e] = p;
        l[e >> 1] += p;
      }
    }
#pragma unroll
    for (int j = 0; j < ND; ++j) {
      o[j][0] *= alpha[0];
      o[j][1] *= alpha[0];
      o[j][2] *= alpha[1];
      o[j][3] *= alpha[1];
    }

    // O += P V (P rounded to bf16, straight from the accumulator registers).
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      uint32_t pa[4];
      pa[0] = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
      pa[1] = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
      pa[2] = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      pa[3] = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
      for (int j = 0; j < ND; ++j) {
        uint32_t b0, b1;
        load_b_n(b0, b1, Vs, LD, j * 8, kk * 16, g, c);
        mma16816(o[j], pa, b0, b1);
      }
    }
  }

  // Finish: full row sums, normalise, write out and lse (natural log).
  bf16* ob = out + static_cast<int64_t>(b) * S * q_stride + static_cast<int64_t>(h) * D;
  float* lb = lse + (static_cast<int64_t>(b) * H + h) * S;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    const int r = row[i];
    if (r < S) {
      const float inv = 1.f / l[i];  // l >= 1: the row maximum contributes exp2(0)
      bf16* orow = ob + static_cast<int64_t>(r) * q_stride;
#pragma unroll
      for (int j = 0; j < ND; ++j)
        *reinterpret_cast<uint32_t*>(orow + j * 8 + 2 * c) = pack_bf16(o[j][2 * i] * inv, o[j][2 * i + 1] * inv);
      if (c == 0) lb[r] = (m[i] + log2f(l[i])) * kLn2;
    }
  }
}

template <int D>
void launch_fwd(const Geom& G, const bf16* q, const bf16* k, const bf16* v, bf16* out, float* lse,
                cudaStream_t stream) {
  const char* op = "attention_forward";
  const size_t smem = fwd_smem_bytes<D>();
  set_smem(attn_fwd_kernel<D>, smem, op);
  const dim3 grid((G.S + kFwdBM - 1) / kFwdBM, G.H, G.B);
  const float scale_log2 = kLog2e / std::sqrt(static_cast<float>(D));
  attn_fwd_kernel<D><<<grid, kFwdThreads, smem, stream>>>(q, k, v, out, lse, G.S, G.H, G.KVH, scale_log2);
  check_launch(op);
}

}  // namespace cuda::attn

void CudaOps::attention_forward(const AttnShape& s, const Tensor& q, const Tensor& k, const Tensor& v,
                                const Tensor& out, const Tensor& lse) {
  using namespace cuda::attn;
  const char* op = "attention_forward";
  const Geom G = check_geom(s, q, k, v, out, lse, op);
  const cuda::bf16* qp = cuda::bf16p(q, op, "q");
  const cuda::bf16* kp = cuda::bf16p(k, op, "k");
  const cuda::bf16* vp = cuda::bf16p(v, op, "v");
  cuda::bf16* outp = cuda::bf16p(out, op, "out");
  float* lsep = cuda::f32(lse, op, "lse");
  if (G.T == 0) return;
  expect_aligned16(qp, op, "q");
  expect_aligned16(kp, op, "k");
  expect_aligned16(vp, op, "v");
  expect_aligned16(outp, op, "out");
  cudaStream_t st = ctx().stream;
  switch (G.D) {
    case 16: launch_fwd<16>(G, qp, kp, vp, outp, lsep, st); break;
    case 32: launch_fwd<32>(G, qp, kp, vp, outp, lsep, st); break;
    case 64: launch_fwd<64>(G, qp, kp, vp, outp, lsep, st); break;
    case 128: launch_fwd<128>(G, qp, kp, vp, outp, lsep, st); break;
    default: cuda::fail(op, "unsupported head_dim " + std::to_string(G.D));
  }
}

}  // namespace mxt
