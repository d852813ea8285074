// MXFP8 quantiser (CPU twin: src/mxfp8/quantize.cpp; rules: include/mxtrain/mxfp8.hpp).
//
// One block of 128 threads (4 warps) owns a 32-row x 128-column tile of one batch entry: it reads the tile
// once into shared memory (16-byte loads where the row length allows), then warp w, lane i quantises
//   rowwise:    row i, columns [32w, 32w + 32) of the tile -> 32 contiguous output bytes + 1 scale
//   columnwise: column 32w + i, rows [0, 32)              -> 32 contiguous output bytes (transposed copy) + 1 scale
// so each lane writes one full 32-byte sector per block. The shared tile is padded to 129 columns, which keeps
// both the row walk and the column walk free of bank conflicts.
//
// The scale rule is the shared integer code (scale_from_amax_bits); elements are x * 2^(127-e) (an exact fp32
// product: __fmul_rn, no flush-to-zero) clamped to +-max and rounded by the hardware cvt.rn.satfinite. The
// clamp makes saturation independent of how the hardware treats Inf; NaN blocks never reach the cvt. Build
// with -DMXT_MXFP8_SOFT_CVT to round with mxfp8::encode instead (should the probe ever disagree).
#include <cuda_fp8.h>

#include <stdexcept>
#include <string>

#include "cuda_common.cuh"
#include "cuda_context.cuh"
#include "cuda_ops.hpp"
#include "mxfp8_cuda.hpp"

namespace mxt::mxfp8 {

namespace {

constexpr int kTileR = 32, kTileC = 128, kThreads = 128;

struct Out {
  uint8_t* data;  // null: this copy is not wanted
  uint8_t* scales;
  Format fmt;
};

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(cuda::bf16 v) { return __bfloat162float(v); }

// Four scaled values -> four FP8 bytes (element j in byte j).
__device__ __forceinline__ uint32_t cvt4(float a, float b, float c, float d, Format f) {
#if defined(MXT_MXFP8_SOFT_CVT)
  return encode(a, f) | (encode(b, f) << 8) | (encode(c, f) << 16) | (static_cast<uint32_t>(encode(d, f)) << 24);
#else
  const float mx = format_max(f);
  a = fminf(fmaxf(a, -mx), mx);
  b = fminf(fmaxf(b, -mx), mx);
  c = fminf(fmaxf(c, -mx), mx);
  d = fminf(fmaxf(d, -mx), mx);
  const __nv_fp8_interpretation_t k = f == Format::E4M3 ? __NV_E4M3 : __NV_E5M2;
  const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, k);
  const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, k);
  return lo | (hi << 16);
#endif
}

// One 32-element block: scale + 32 bytes to out (16-byte aligned).
__device__ __forceinline__ void quantize_block(const float (&v)[kBlock], Format f, uint8_t* out, uint8_t* scale) {
  uint32_t amax = 0;
#pragma unroll
  for (int j = 0; j < kBlock; ++j) amax = max(amax, abs_bits(v[j]));
  const uint8_t e = scale_from_amax_bits(amax, f);
  *scale = e;
  uint32_t w[8];
  if (e == 0xFF) {
#pragma unroll
    for (int q = 0; q < 8; ++q) w[q] = 0x01010101u * kNaNCode;
  } else {
    const float m = quant_multiplier(e);
#pragma unroll
    for (int q = 0; q < 8; ++q)
      w[q] = cvt4(__fmul_rn(v[4 * q], m), __fmul_rn(v[4 * q + 1], m), __fmul_rn(v[4 * q + 2], m),
                  __fmul_rn(v[4 * q + 3], m), f);
  }
  uint4* o = reinterpret_cast<uint4*>(out);
  o[0] = make_uint4(w[0], w[1], w[2], w[3]);
  o[1] = make_uint4(w[4], w[5], w[6], w[7]);
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    quantize_kernel(const T* __restrict__ x, int64_t rows, int64_t cols, int64_t row_tiles, bool vec_ok, Out rw,
                    Out cw) {
  __shared__ float tile[kTileR][kTileC + 1];
  const int64_t b = blockIdx.z;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kTileC;
  const T* xb = x + b * rows * cols;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int64_t rt = blockIdx.y; rt < row_tiles; rt += gridDim.y) {
    const int64_t r0 = rt * kTileR;
    if (vec_ok) {  // cols % V == 0 and x 16-byte aligned: a chunk is all in or all out
      constexpr int V = 16 / sizeof(T), CH = kTileC / V;
      for (int idx = threadIdx.x; idx < kTileR * CH; idx += kThreads) {
        const int i = idx / CH, ch = idx % CH;
        const int64_t r = r0 + i, c = c0 + ch * V;
        union {
          uint4 u;
          T t[V];
        } chunk;
        if (r < rows && c < cols) {
          chunk.u = __ldg(reinterpret_cast<const uint4*>(xb + r * cols + c));
        } else {
          chunk.u = make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int k = 0; k < V; ++k) tile[i][ch * V + k] = to_f32(chunk.t[k]);
      }
    } else {
      for (int idx = threadIdx.x; idx < kTileR * kTileC; idx += kThreads) {
        const int i = idx / kTileC, j = idx % kTileC;
        const int64_t r = r0 + i, c = c0 + j;
        tile[i][j] = (r < rows && c < cols) ? to_f32(xb[r * cols + c]) : 0.f;
      }
    }
    __syncthreads();
    float v[kBlock];
    const int64_t cb = c0 + 32 * warp;  // this warp's 32-column slice
    if (rw.data && r0 + lane < rows && cb < cols) {  // rowwise: cols % 32 == 0, so the slice is whole
      const int64_t r = r0 + lane;
#pragma unroll
      for (int j = 0; j < kBlock; ++j) v[j] = tile[lane][32 * warp + j];
      quantize_block(v, rw.fmt, rw.data + (b * rows + r) * cols + cb,
                     rw.scales + (b * rows + r) * (cols / kBlock) + cb / kBlock);
    }
    if (cw.data && cb + lane < cols) {  // columnwise: rows % 32 == 0, so the 32 rows are whole
      const int64_t c = cb + lane;
#pragma unroll
      for (int j = 0; j < kBlock; ++j) v[j] = tile[j][32 * warp + lane];
      quantize_block(v, cw.fmt, cw.data + (b * cols + c) * rows + r0,
                     cw.scales + (b * cols + c) * (rows / kBlock) + r0 / kBlock);
    }
    __syncthreads();  // the tile is reloaded on the next row tile
  }
}

void check_view(const MxView* v, int64_t batch, int64_t rows, int64_t cols, Direction want, const char* op) {
  const std::string what = std::string(op) + ": the " + direction_name(want) + " output";
  if (v->dir != want) throw std::invalid_argument(what + " view has the other direction");
  if (v->device != Device::CUDA) throw std::invalid_argument(what + " is not a CUDA view");
  if (v->batch != batch || v->rows != rows || v->cols != cols)
    throw std::invalid_argument(what + " has shape [" + std::to_string(v->batch) + ", " + std::to_string(v->rows) +
                                ", " + std::to_string(v->cols) + "], the input [" + std::to_string(batch) + ", " +
                                std::to_string(rows) + ", " + std::to_string(cols) + "]");
  check_shape(batch, rows, cols, want, op);
  if (v->data_bytes() > 0 && (!v->data || !v->scales)) throw std::invalid_argument(what + " has no buffers");
  if (reinterpret_cast<uintptr_t>(v->data) % 16 != 0)
    throw std::invalid_argument(what + " data must be 16-byte aligned");
}

// ---- the cvt probe ----------------------------------------------------------------------------------------

__global__ void cvt_probe_kernel(Format f, unsigned long long* count, uint32_t* first) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (1ull << 32); i += stride) {
    const uint32_t bits = static_cast<uint32_t>(i);
    if ((bits & 0x7FFFFFFFu) > kInfBits) continue;  // NaNs never reach the cvt
    const float x = bits_f32(bits);
    const uint8_t hw = static_cast<uint8_t>(cvt4(x, 0.f, 0.f, 0.f, f) & 0xFFu);
    if (hw != encode(x, f)) {
      const unsigned long long n = atomicAdd(count, 1ull);
      if (n < 16) first[n] = bits;
    }
  }
}

}  // namespace

void quantize_cuda(CudaOps& ops, const Tensor& x, const MxView* rowwise, const MxView* colwise) {
  const char* op = "mxfp8::quantize_cuda";
  if (!rowwise && !colwise) throw std::invalid_argument(std::string(op) + ": no output requested");
  if (x.ndim != 2 && x.ndim != 3)
    throw std::invalid_argument(std::string(op) + ": x must be [rows, cols] or [batch, rows, cols], got " +
                                x.shape_str());
  if (x.dtype != DType::BF16 && x.dtype != DType::F32)
    throw std::invalid_argument(std::string(op) + ": x must be BF16 or F32, got " + dtype_name(x.dtype));
  if (x.device != Device::CUDA) throw std::invalid_argument(std::string(op) + ": x is not a CUDA tensor");
  const int64_t batch = x.ndim == 3 ? x.shape[0] : 1, rows = x.dim(-2), cols = x.dim(-1);
  if (rowwise) check_view(rowwise, batch, rows, cols, Direction::Rowwise, op);
  if (colwise) check_view(colwise, batch, rows, cols, Direction::Columnwise, op);
  if (batch * rows * cols == 0) return;
  if (!x.data) throw std::invalid_argument(std::string(op) + ": x has no data");
  if (batch > 65535) throw std::invalid_argument(std::string(op) + ": batch above 65535");
  const int64_t row_tiles = (rows + kTileR - 1) / kTileR, col_tiles = (cols + kTileC - 1) / kTileC;
  if (col_tiles > 0x7FFFFFFF) throw std::invalid_argument(std::string(op) + ": too many columns");
  const dim3 grid(static_cast<unsigned>(col_tiles), static_cast<unsigned>(row_tiles < 65535 ? row_tiles : 65535),
                  static_cast<unsigned>(batch));
  const Out rw{rowwise ? rowwise->data : nullptr, rowwise ? rowwise->scales : nullptr,
               rowwise ? rowwise->format : Format::E4M3};
  const Out cw{colwise ? colwise->data : nullptr, colwise ? colwise->scales : nullptr,
               colwise ? colwise->format : Format::E4M3};
  const bool aligned = reinterpret_cast<uintptr_t>(x.data) % 16 == 0;
  cudaStream_t st = ops.ctx().stream;
  if (x.dtype == DType::BF16) {
    quantize_kernel<cuda::bf16><<<grid, kThreads, 0, st>>>(static_cast<const cuda::bf16*>(x.data), rows, cols,
                                                           row_tiles, aligned && cols % 8 == 0, rw, cw);
  } else {
    quantize_kernel<float><<<grid, kThreads, 0, st>>>(static_cast<const float*>(x.data), rows, cols, row_tiles,
                                                      aligned && cols % 4 == 0, rw, cw);
  }
  cuda::check_launch(op);
}

int64_t cvt_probe_cuda(CudaOps& ops, Format f, std::vector<uint32_t>* first) {
  const char* op = "mxfp8::cvt_probe_cuda";
  void* buf = ops.alloc(8 + 16 * 4);
  cudaStream_t st = ops.ctx().stream;
  cuda::check(cudaMemsetAsync(buf, 0, 8 + 16 * 4, st), op, "cudaMemsetAsync");
  auto* count = static_cast<unsigned long long*>(buf);
  auto* firsts = reinterpret_cast<uint32_t*>(static_cast<char*>(buf) + 8);
  cvt_probe_kernel<<<ops.ctx().num_sms * 8, 256, 0, st>>>(f, count, firsts);
  cuda::check_launch(op);
  unsigned long long n = 0;
  uint32_t host_first[16] = {};
  ops.download(&n, count, 8);
  ops.download(host_first, firsts, sizeof(host_first));
  ops.release(buf);
  if (first) first->assign(host_first, host_first + (n < 16 ? n : 16));
  return static_cast<int64_t>(n);
}

}  // namespace mxt::mxfp8
