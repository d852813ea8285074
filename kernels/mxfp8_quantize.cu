// MXFP8 quantiser (CPU twin: src/mxfp8/quantize.cpp; rules: include/mxtrain/mxfp8.hpp).
//
// One block of 256 threads (8 warps) owns a 64-row x 128-column tile of one batch entry: it reads the tile once
// into shared memory in x's own type (16-byte loads and stores where the row length allows), then thread t
// quantises one block each way:
//   rowwise:    row t / 4, columns [32 (t % 4), +32)  -> 32 codes + 1 scale
//   columnwise: column t % 128, rows [32 (t / 128), +32) -> 32 codes (transposed copy) + 1 scale
// into shared staging buffers, from which the block writes whole sectors: each tile row's 128 rowwise codes and
// each column's 64 columnwise codes as contiguous 16-byte pieces, a row's 4 scales as one word where aligned.
// With a values output (mx_quantize_values) the rowwise copy leaves as the bf16 values of its staged codes, 16 per
// thread, consecutive threads on adjacent 32-byte pieces of a row (until session 22 each thread wrote its block's
// 64 bytes of values straight from the row walk, 8 threads per 256-byte row segment).
// Until session 22 each lane stored its 32 codes as two 16-byte halves of a sector and its scale as a single byte,
// from 32-row tiles: both copies of 8x7B's dh13 took 1.415 ms (1.33 TB/s); whole-sector stores take 0.790 ms
// (2.38 TB/s; docs/perf.md). The shared rows are padded by 16 bytes: the chunk stores, both walks and the staging
// stores are free of bank conflicts.
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

constexpr int kTileR = 64, kTileC = 128, kThreads = 256;

struct Out {
  uint8_t* data;  // null: this copy is not wanted
  uint8_t* scales;
  Format fmt;
  cuda::bf16* values;  // rowwise only: the copy's values in x's layout instead of codes and scales (data null)
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

// One 32-element block: its scale (returned) and its 32 codes in w (byte j of the block in byte j % 4 of w[j / 4]).
__device__ __forceinline__ uint8_t quantize_codes(const float (&v)[kBlock], Format f, uint32_t (&w)[8]) {
  uint32_t amax = 0;
#pragma unroll
  for (int j = 0; j < kBlock; ++j) amax = max(amax, abs_bits(v[j]));
  const uint8_t e = scale_from_amax_bits(amax, f);
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
  return e;
}

// The codes to out (shared or global, 16-byte aligned).
__device__ __forceinline__ void store_codes(const uint32_t (&w)[8], uint8_t* out) {
  uint4* o = reinterpret_cast<uint4*>(out);
  o[0] = make_uint4(w[0], w[1], w[2], w[3]);
  o[1] = make_uint4(w[4], w[5], w[6], w[7]);
}

// Two FP8 codes (low 16 bits of c) -> their exact values: the hardware widening to fp16 (every E4M3 / E5M2 value
// but NaN is an fp16 value), then to fp32; the same floats as decode().
__device__ __forceinline__ float2 widen2(uint32_t c, Format f) {
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(c & 0xFFFFu), f == Format::E4M3 ? __NV_E4M3 : __NV_E5M2);
  return __half22float2(*reinterpret_cast<const __half2*>(&h));
}

__device__ __forceinline__ uint32_t pack_bf16(float a, float b) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// 16 staged codes of one block (scale code e) -> their bf16 values at out (16-byte aligned), as the dequantiser
// computes them (decode(q) * scale): the codes never reach memory. A NaN block's values are the dequantiser's NaN.
__device__ __forceinline__ void values16(const uint8_t* codes, uint8_t e, Format f, cuda::bf16* out) {
  const float s = scale_value(e);
  uint4* o = reinterpret_cast<uint4*>(out);
  if (e == 0xFF) {
    const float nan = decode(kNaNCode, f) * s;
    const uint32_t w = pack_bf16(nan, nan);
    o[0] = o[1] = make_uint4(w, w, w, w);
    return;
  }
  const uint4 c = *reinterpret_cast<const uint4*>(codes);
  const uint32_t cw[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
  for (int q = 0; q < 2; ++q) {  // 8 values per 16-byte store
    uint32_t w[4];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t c4 = cw[2 * q + h];
      const float2 lo = widen2(c4, f), hi = widen2(c4 >> 16, f);
      w[2 * h] = pack_bf16(lo.x * s, lo.y * s);
      w[2 * h + 1] = pack_bf16(hi.x * s, hi.y * s);
    }
    o[q] = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// The shared tile in x's own element type plus the staged codes and scales. Rows padded by 16 bytes.
template <typename T>
struct Tile {
  static constexpr int kV = 16 / static_cast<int>(sizeof(T));  // elements per 16-byte chunk
  alignas(16) T e[kTileR][kTileC + kV];
  alignas(16) uint8_t rcodes[kTileR][kTileC + 16];  // rowwise codes, in the output's layout
  alignas(16) uint8_t ccodes[kTileC][kTileR + 16];  // columnwise codes: a column's 64 codes contiguous
  uint8_t rscale[kTileR][kTileC / kBlock];
  uint8_t cscale[kTileC][kTileR / kBlock];
};

// 8 bf16 (one 16-byte chunk) -> 8 floats, exactly.
__device__ __forceinline__ void widen8(const uint4& u, float* o) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    o[2 * k] = __uint_as_float(w[k] << 16);
    o[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads, 3)  // 3 blocks (768 threads) per SM: at most 80 registers, no spills
    quantize_kernel(const T* __restrict__ x, int64_t rows, int64_t cols, int64_t row_tiles, bool vec_ok, Out rw,
                    Out cw) {
  constexpr int V = Tile<T>::kV;
  extern __shared__ uint4 smem_raw[];
  Tile<T>& tile = *reinterpret_cast<Tile<T>*>(smem_raw);
  const int64_t b = blockIdx.z;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kTileC;
  const T* xb = x + b * rows * cols;
  const int t = threadIdx.x;
  const int64_t tcols = cols - c0 < kTileC ? cols - c0 : kTileC;  // this tile's columns (a multiple of 32 where
                                                                   // a copy is made)
  for (int64_t rt = blockIdx.y; rt < row_tiles; rt += gridDim.y) {
    const int64_t r0 = rt * kTileR;
    const int64_t trows = rows - r0 < kTileR ? rows - r0 : kTileR;
    if (vec_ok) {  // cols % V == 0 and x 16-byte aligned: a chunk is all in or all out
      constexpr int CH = kTileC / V;
      for (int idx = t; idx < kTileR * CH; idx += kThreads) {
        const int i = idx / CH, ch = idx % CH;
        const int64_t r = r0 + i, c = c0 + ch * V;
        const uint4 u = r < rows && c < cols ? __ldg(reinterpret_cast<const uint4*>(xb + r * cols + c))
                                             : make_uint4(0, 0, 0, 0);  // zero bits: +0 in either type
        *reinterpret_cast<uint4*>(&tile.e[i][ch * V]) = u;
      }
    } else {
      for (int idx = t; idx < kTileR * kTileC; idx += kThreads) {
        const int i = idx / kTileC, j = idx % kTileC;
        const int64_t r = r0 + i, c = c0 + j;
        tile.e[i][j] = (r < rows && c < cols) ? xb[r * cols + c] : T(0.f);
      }
    }
    __syncthreads();
    float v[kBlock];
    uint32_t w[8];
    {  // rowwise: row i, block k (cols % 32 == 0: a block inside the tile is whole)
      const int i = t / 4, k = t % 4;
      if ((rw.data || rw.values) && i < trows && 32 * k < tcols) {
        if constexpr (V == 8) {
#pragma unroll
          for (int q = 0; q < kBlock / 8; ++q)
            widen8(*reinterpret_cast<const uint4*>(&tile.e[i][32 * k + 8 * q]), v + 8 * q);
        } else {
#pragma unroll
          for (int q = 0; q < kBlock / 4; ++q) {
            const float4 f4 = *reinterpret_cast<const float4*>(&tile.e[i][32 * k + 4 * q]);
            v[4 * q] = f4.x;
            v[4 * q + 1] = f4.y;
            v[4 * q + 2] = f4.z;
            v[4 * q + 3] = f4.w;
          }
        }
        tile.rscale[i][k] = quantize_codes(v, rw.fmt, w);
        store_codes(w, &tile.rcodes[i][32 * k]);
      }
    }
    {  // columnwise: column j, rows [32h, 32h + 32) (rows % 32 == 0: a block inside the tile is whole)
      const int j = t % kTileC, h = t / kTileC;
      if (cw.data && j < tcols && 32 * h < trows) {
#pragma unroll
        for (int k = 0; k < kBlock; ++k) v[k] = to_f32(tile.e[32 * h + k][j]);
        tile.cscale[j][h] = quantize_codes(v, cw.fmt, w);
        store_codes(w, &tile.ccodes[j][32 * h]);
      }
    }
    __syncthreads();
    if (rw.data) {  // each row's codes as 16-byte pieces (8 per 128 columns), its scales as one word if aligned
      for (int idx = t; idx < kTileR * (kTileC / 16); idx += kThreads) {
        const int i = idx / (kTileC / 16), ch = idx % (kTileC / 16);
        if (i < trows && 16 * ch < tcols)
          *reinterpret_cast<uint4*>(rw.data + (b * rows + r0 + i) * cols + c0 + 16 * ch) =
              *reinterpret_cast<const uint4*>(&tile.rcodes[i][16 * ch]);
      }
      if (t < trows) {
        uint8_t* s = rw.scales + (b * rows + r0 + t) * (cols / kBlock) + c0 / kBlock;
        if (tcols == kTileC && reinterpret_cast<uintptr_t>(s) % 4 == 0) {
          *reinterpret_cast<uint32_t*>(s) = *reinterpret_cast<const uint32_t*>(&tile.rscale[t][0]);
        } else {
          for (int k = 0; 32 * k < tcols; ++k) s[k] = tile.rscale[t][k];
        }
      }
    }
    if (rw.values) {  // each row's values, 16 codes (32 bytes of bf16) per thread, consecutive threads adjacent
      for (int idx = t; idx < kTileR * (kTileC / 16); idx += kThreads) {
        const int i = idx / (kTileC / 16), ch = idx % (kTileC / 16);
        if (i < trows && 16 * ch < tcols)
          values16(&tile.rcodes[i][16 * ch], tile.rscale[i][ch / 2], rw.fmt,
                   rw.values + (b * rows + r0 + i) * cols + c0 + 16 * ch);
      }
    }
    if (cw.data) {  // each column's codes as 16-byte pieces (4 per 64 rows), its 2 scales
      for (int idx = t; idx < kTileC * (kTileR / 16); idx += kThreads) {
        const int j = idx / (kTileR / 16), ch = idx % (kTileR / 16);
        if (j < tcols && 16 * ch < trows)
          *reinterpret_cast<uint4*>(cw.data + (b * cols + c0 + j) * rows + r0 + 16 * ch) =
              *reinterpret_cast<const uint4*>(&tile.ccodes[j][16 * ch]);
      }
      if (t < tcols) {
        uint8_t* s = cw.scales + (b * cols + c0 + t) * (rows / kBlock) + r0 / kBlock;
        for (int h = 0; 32 * h < trows; ++h) s[h] = tile.cscale[t][h];
      }
    }
    __syncthreads();  // the tile and the staging are reused on the next row tile
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

namespace {

// x's checks and the launch: the rowwise copy as codes (rowwise), as values (row_values, format row_fmt), or not.
void launch_quantize(CudaOps& ops, const char* op, const Tensor& x, const MxView* rowwise, cuda::bf16* row_values,
                     Format row_fmt, const MxView* colwise) {
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
  // (Row tiles fastest in the grid measured no faster for codes and slower for values: session 21.)
  if (col_tiles > 0x7FFFFFFF) throw std::invalid_argument(std::string(op) + ": too many columns");
  const dim3 grid(static_cast<unsigned>(col_tiles), static_cast<unsigned>(row_tiles < 65535 ? row_tiles : 65535),
                  static_cast<unsigned>(batch));
  const Out rw{rowwise ? rowwise->data : nullptr, rowwise ? rowwise->scales : nullptr,
               rowwise ? rowwise->format : row_fmt, row_values};
  const Out cw{colwise ? colwise->data : nullptr, colwise ? colwise->scales : nullptr,
               colwise ? colwise->format : Format::E4M3, nullptr};
  const bool aligned = reinterpret_cast<uintptr_t>(x.data) % 16 == 0;
  cudaStream_t st = ops.ctx().stream;
  // Shared memory above the 48 KiB default (the fp32 tile): opted in once per instantiation.
  static const bool opted = [&] {
    cuda::check(cudaFuncSetAttribute(quantize_kernel<cuda::bf16>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(sizeof(Tile<cuda::bf16>))), op, "cudaFuncSetAttribute");
    cuda::check(cudaFuncSetAttribute(quantize_kernel<float>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(sizeof(Tile<float>))), op, "cudaFuncSetAttribute");
    return true;
  }();
  (void)opted;
  if (x.dtype == DType::BF16) {
    quantize_kernel<cuda::bf16><<<grid, kThreads, sizeof(Tile<cuda::bf16>), st>>>(
        static_cast<const cuda::bf16*>(x.data), rows, cols, row_tiles, aligned && cols % 8 == 0, rw, cw);
  } else {
    quantize_kernel<float><<<grid, kThreads, sizeof(Tile<float>), st>>>(
        static_cast<const float*>(x.data), rows, cols, row_tiles, aligned && cols % 4 == 0, rw, cw);
  }
  cuda::check_launch(op);
}

}  // namespace

void quantize_cuda(CudaOps& ops, const Tensor& x, const MxView* rowwise, const MxView* colwise) {
  const char* op = "mxfp8::quantize_cuda";
  if (!rowwise && !colwise) throw std::invalid_argument(std::string(op) + ": no output requested");
  launch_quantize(ops, op, x, rowwise, nullptr, Format::E4M3, colwise);
}

void quantize_values_cuda(CudaOps& ops, const Tensor& x, Format row_format, const Tensor& row_values,
                          const MxView* colwise) {
  const char* op = "mxfp8::quantize_values_cuda";
  if (row_values.dtype != DType::BF16 || row_values.device != Device::CUDA)
    throw std::invalid_argument(std::string(op) + ": row_values must be a CUDA BF16 tensor, got " +
                                dtype_name(row_values.dtype));
  if (row_values.numel() != x.numel())
    throw std::invalid_argument(std::string(op) + ": row_values must hold x's " + std::to_string(x.numel()) +
                                " values, got " + row_values.shape_str());
  if (reinterpret_cast<uintptr_t>(row_values.data) % 16 != 0)
    throw std::invalid_argument(std::string(op) + ": row_values must be 16-byte aligned");
  if (x.ndim == 2 || x.ndim == 3)
    check_shape(x.ndim == 3 ? x.shape[0] : 1, x.dim(-2), x.dim(-1), Direction::Rowwise, op);
  launch_quantize(ops, op, x, nullptr, static_cast<cuda::bf16*>(row_values.data), row_format, colwise);
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
