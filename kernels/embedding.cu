// Token embedding: forward gather (BF16 table -> BF16 rows) and a deterministic backward into the F32 table
// gradient.
//
// Backward: the token indices are stably sorted by id (CUB radix sort on (id, t) pairs; stable, so equal ids
// keep token order). Each run of equal ids is then reduced by the thread(s) that own its first position:
// per column, acc = dtable[id, col]; acc += dout[t, col] for the run's tokens in ascending t;
// dtable[id, col] = acc. That is exactly the CPU twin's summation order, with no atomics: the result is
// bitwise reproducible (and equal to the CPU twin's, since bf16 -> fp32 is exact).
//
// Ids outside [0, V) cannot be reported from the device without a host sync: forward writes a zero row for
// them and backward ignores them. The data loader validates ids against the vocabulary.
#include <cub/device/device_radix_sort.cuh>

#include <string>

#include "cuda_common.cuh"
#include "cuda_context.cuh"
#include "cuda_ops.hpp"

namespace mxt {

namespace {

using cuda::bf16;

constexpr int kThreads = 256;

// One block per token (grid-stride over tokens); 16-byte copies when rows allow it.
template <typename V>
__global__ void embedding_gather_kernel(const int32_t* __restrict__ ids, const V* __restrict__ table,
                                        V* __restrict__ out, int64_t T, int64_t V_rows, int64_t row_vecs) {
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    const int64_t id = ids[t];
    const bool valid = id >= 0 && id < V_rows;
    V* o = out + t * row_vecs;
    const V* src = table + (valid ? id : 0) * row_vecs;
    for (int64_t j = threadIdx.x; j < row_vecs; j += blockDim.x) o[j] = valid ? src[j] : V{};
  }
}

// keys[t] = ids[t] if valid else V (a sentinel that sorts last and is skipped); vals[t] = t.
__global__ void embedding_keys_kernel(const int32_t* __restrict__ ids, int32_t* __restrict__ keys,
                                      int32_t* __restrict__ vals, int32_t T, int32_t V) {
  for (int32_t t = blockIdx.x * blockDim.x + threadIdx.x; t < T; t += gridDim.x * blockDim.x) {
    const int32_t id = ids[t];
    keys[t] = (id >= 0 && id < V) ? id : V;
    vals[t] = t;
  }
}

// grid (ceil(d / blockDim), positions); block (c, i) handles columns [c*blockDim, (c+1)*blockDim) of the
// run that starts at sorted position i (and does nothing when i does not start a run).
__global__ void embedding_accumulate_kernel(const int32_t* __restrict__ sorted_ids,
                                            const int32_t* __restrict__ sorted_t, const bf16* __restrict__ dout,
                                            float* __restrict__ dtable, int32_t T, int32_t V, int64_t d) {
  for (int32_t i = blockIdx.y; i < T; i += gridDim.y) {
    const int32_t id = sorted_ids[i];
    if (id >= V) continue;                                // invalid ids (sentinel); they sort last
    if (i > 0 && sorted_ids[i - 1] == id) continue;       // not the first position of its run
    const int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (col >= d) continue;
    float* dst = dtable + static_cast<int64_t>(id) * d + col;
    float acc = *dst;
    for (int32_t j = i; j < T && sorted_ids[j] == id; ++j)
      acc = __fadd_rn(acc, __bfloat162float(dout[static_cast<int64_t>(sorted_t[j]) * d + col]));
    *dst = acc;
  }
}

// The same with 4 columns per thread (d % 4 == 0, dtable 16-byte and dout 8-byte aligned: every model shape):
// float4 / 8-byte accesses instead of a 4-byte and a 2-byte one per column; the same adds in the same order.
__global__ void embedding_accumulate_vec4_kernel(const int32_t* __restrict__ sorted_ids,
                                                 const int32_t* __restrict__ sorted_t, const bf16* __restrict__ dout,
                                                 float* __restrict__ dtable, int32_t T, int32_t V, int64_t d) {
  const int64_t col = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 4;
  if (col >= d) return;
  for (int32_t i = blockIdx.y; i < T; i += gridDim.y) {
    const int32_t id = sorted_ids[i];
    if (id >= V) continue;                           // invalid ids (sentinel); they sort last
    if (i > 0 && sorted_ids[i - 1] == id) continue;  // not the first position of its run
    float4* dst = reinterpret_cast<float4*>(dtable + static_cast<int64_t>(id) * d + col);
    float4 acc = *dst;
    for (int32_t j = i; j < T && sorted_ids[j] == id; ++j) {
      const uint2 g = *reinterpret_cast<const uint2*>(dout + static_cast<int64_t>(sorted_t[j]) * d + col);
      acc.x = __fadd_rn(acc.x, __uint_as_float(g.x << 16));
      acc.y = __fadd_rn(acc.y, __uint_as_float(g.x & 0xffff0000u));
      acc.z = __fadd_rn(acc.z, __uint_as_float(g.y << 16));
      acc.w = __fadd_rn(acc.w, __uint_as_float(g.y & 0xffff0000u));
    }
    *dst = acc;
  }
}

size_t align_up(size_t x) { return (x + 255) / 256 * 256; }

int bits_for(int64_t max_value) {  // bits needed to represent 0..max_value
  int b = 1;
  while ((int64_t{1} << b) <= max_value) ++b;
  return b;
}

}  // namespace

void CudaOps::embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& out) {
  const char* op = "embedding_forward";
  const int64_t T = ids.numel(), V = table.ndim ? table.shape[0] : 0;
  const int64_t d = V ? table.numel() / V : 0;
  const int32_t* idp = cuda::i32(ids, op, "ids");
  const bf16* tab = cuda::bf16p(table, op, "table");
  bf16* o = cuda::bf16p(out, op, "out");
  if ((out.ndim ? out.shape[0] : 0) != T || out.numel() != T * d)
    cuda::fail(op, "out has shape " + out.shape_str() + ", expected " + std::to_string(T) + " rows of " +
                       std::to_string(d) + " (table " + table.shape_str() + ")");
  if (T == 0 || d == 0) return;
  if (V == 0) cuda::fail(op, "table is empty");
  const unsigned grid = static_cast<unsigned>(T < 65535 * 16 ? T : 65535 * 16);
  const bool vec = d % 8 == 0 && reinterpret_cast<uintptr_t>(tab) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(o) % 16 == 0;
  if (vec) {
    embedding_gather_kernel<<<grid, kThreads, 0, ctx_->stream>>>(
        idp, reinterpret_cast<const uint4*>(tab), reinterpret_cast<uint4*>(o), T, V, d / 8);
  } else {
    embedding_gather_kernel<<<grid, kThreads, 0, ctx_->stream>>>(
        idp, reinterpret_cast<const unsigned short*>(tab), reinterpret_cast<unsigned short*>(o), T, V, d);
  }
  cuda::check_launch(op);
}

void CudaOps::embedding_backward(const Tensor& ids, const Tensor& dout, const Tensor& dtable) {
  const char* op = "embedding_backward";
  const int64_t T = ids.numel(), V = dtable.ndim ? dtable.shape[0] : 0;
  const int64_t d = V ? dtable.numel() / V : 0;
  const int32_t* idp = cuda::i32(ids, op, "ids");
  const bf16* g = cuda::bf16p(dout, op, "dout");
  float* dt = cuda::f32(dtable, op, "dtable");
  if ((dout.ndim ? dout.shape[0] : 0) != T || dout.numel() != T * d)
    cuda::fail(op, "dout has shape " + dout.shape_str() + ", expected " + std::to_string(T) + " rows of " +
                       std::to_string(d) + " (dtable " + dtable.shape_str() + ")");
  if (T == 0 || d == 0) return;
  if (V == 0) cuda::fail(op, "dtable is empty");
  if (T >= (int64_t{1} << 31) - 1) cuda::fail(op, "too many tokens: " + std::to_string(T));
  if (V >= (int64_t{1} << 31) - 1) cuda::fail(op, "vocab too large: " + std::to_string(V));
  const int32_t Ti = static_cast<int32_t>(T), Vi = static_cast<int32_t>(V);
  const int end_bit = bits_for(V);  // keys are in [0, V]

  // Scratch: keys_in, vals_in, keys_out, vals_out (T int32 each), then CUB's temporary storage.
  size_t cub_bytes = 0;
  cuda::check(cub::DeviceRadixSort::SortPairs(nullptr, cub_bytes, static_cast<const int32_t*>(nullptr),
                                              static_cast<int32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                              static_cast<int32_t*>(nullptr), Ti, 0, end_bit, ctx_->stream),
              op, "cub radix sort (size query)");
  const size_t arr = align_up(sizeof(int32_t) * static_cast<size_t>(T));
  char* base = static_cast<char*>(ctx_->scratch("embedding_backward", 4 * arr + align_up(cub_bytes)));
  auto* keys_in = reinterpret_cast<int32_t*>(base);
  auto* vals_in = reinterpret_cast<int32_t*>(base + arr);
  auto* keys_out = reinterpret_cast<int32_t*>(base + 2 * arr);
  auto* vals_out = reinterpret_cast<int32_t*>(base + 3 * arr);
  void* cub_tmp = base + 4 * arr;

  embedding_keys_kernel<<<cuda::blocks_for(T, kThreads), kThreads, 0, ctx_->stream>>>(idp, keys_in, vals_in,
                                                                                        Ti, Vi);
  cuda::check_launch(op);
  cuda::check(cub::DeviceRadixSort::SortPairs(cub_tmp, cub_bytes, keys_in, keys_out, vals_in, vals_out, Ti, 0,
                                              end_bit, ctx_->stream),
              op, "cub radix sort");
  cuda::check_launch(op);
  const bool vec = d % 4 == 0 && reinterpret_cast<uintptr_t>(dt) % 16 == 0 && reinterpret_cast<uintptr_t>(g) % 8 == 0;
  const int64_t cols_per_block = vec ? 4 * kThreads : kThreads;
  const int64_t col_blocks = (d + cols_per_block - 1) / cols_per_block;
  if (col_blocks > 0x7fffffffLL) cuda::fail(op, "rows too wide: " + std::to_string(d));
  const dim3 grid(static_cast<unsigned>(col_blocks), static_cast<unsigned>(T < 65535 ? T : 65535));
  if (vec)
    embedding_accumulate_vec4_kernel<<<grid, kThreads, 0, ctx_->stream>>>(keys_out, vals_out, g, dt, Ti, Vi, d);
  else
    embedding_accumulate_kernel<<<grid, kThreads, 0, ctx_->stream>>>(keys_out, vals_out, g, dt, Ti, Vi, d);
  cuda::check_launch(op);
}

}  // namespace mxt
