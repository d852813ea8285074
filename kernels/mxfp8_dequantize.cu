// MXFP8 dequantiser (CPU twin: CpuOps::mx_dequantize over mxfp8::decode / scale_value): a copy's values as bf16
// in the logical layout [batch, rows, cols], for fp8_config.hopper_gemm=bf16, where the MXFP8 GEMMs run on the
// bf16 tensor cores over these exact values (on Hopper an exact 32-block MXFP8 GEMM is bounded by the bf16 rate
// anyway: docs/perf.md, "What limits MXFP8 on Hopper").
//
// Rowwise copies are stored in the logical layout: one thread turns 16 codes (half a block, one scale) into 16
// bf16. Columnwise copies are stored transposed ([batch][cols][rows], blocks along rows): a block transposes a
// 64 x 64 tile through shared memory with 16-byte loads and 8-byte stores.
#include <cuda_bf16.h>

#include <stdexcept>
#include <string>

#include "cuda_common.cuh"
#include "cuda_context.cuh"
#include "cuda_ops.hpp"
#include "mxfp8_cuda.hpp"

namespace mxt::mxfp8 {

namespace {

__device__ __forceinline__ void load_lut(float* lut, Format f) {
  for (int q = threadIdx.x + threadIdx.y * blockDim.x; q < 256; q += blockDim.x * blockDim.y)
    lut[q] = decode(static_cast<uint8_t>(q), f);
  __syncthreads();
}

__device__ __forceinline__ uint32_t pack2(float a, float b) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// n16 groups of 16 codes; group g uses scale g / 2.
__global__ void dequant_rowwise_kernel(const uint8_t* __restrict__ data, const uint8_t* __restrict__ scales,
                                       Format f, int64_t n16, cuda::bf16* __restrict__ out) {
  __shared__ float lut[256];
  load_lut(lut, f);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < n16; g += stride) {
    const uint4 c = reinterpret_cast<const uint4*>(data)[g];
    const float s = scale_value(scales[g / 2]);
    const uint32_t w[4] = {c.x, c.y, c.z, c.w};
    uint32_t o[8];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      o[2 * i] = pack2(lut[w[i] & 0xFFu] * s, lut[(w[i] >> 8) & 0xFFu] * s);
      o[2 * i + 1] = pack2(lut[(w[i] >> 16) & 0xFFu] * s, lut[w[i] >> 24] * s);
    }
    uint4* dst = reinterpret_cast<uint4*>(out) + 2 * g;
    dst[0] = make_uint4(o[0], o[1], o[2], o[3]);
    dst[1] = make_uint4(o[4], o[5], o[6], o[7]);
  }
}

// Stored [batch][cols][rows] (rows a multiple of 32) -> out [batch][rows][cols], in tiles of 64 stored rows
// (output columns c0..c0+63) x 64 codes (output rows r0..r0+63; two scale blocks per stored row). 256 threads:
// thread t loads 16 codes (16 bytes: 4 threads cover a stored row's 64 bytes) and writes their values down a
// column of the shared tile; then each output row leaves as 128 contiguous bytes, 8 per thread (vec: cols % 4 == 0
// and out 8-byte aligned; else element by element).
constexpr int kColTile = 64;
__global__ void __launch_bounds__(256) dequant_colwise_kernel(const uint8_t* __restrict__ data,
                                                              const uint8_t* __restrict__ scales, Format f,
                                                              int64_t rows, int64_t cols, bool vec,
                                                              cuda::bf16* __restrict__ out) {
  __shared__ float lut[256];
  __shared__ float tile[kColTile][kColTile + 1];  // [output row][output column]
  load_lut(lut, f);
  const int64_t b = blockIdx.z;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kColTile, c0 = static_cast<int64_t>(blockIdx.y) * kColTile;
  const int t = threadIdx.x;
  const uint8_t* src = data + b * cols * rows;
  const uint8_t* sc = scales + b * cols * (rows / kBlock);
  {
    const int seg = t % 4, j = t / 4;  // codes [16 seg, 16 seg + 16) of stored row c0 + j
    const int64_t c = c0 + j, r = r0 + 16 * seg;
    float v[16];
    if (c < cols && r < rows) {  // rows is a multiple of 32: a 16-code segment is all in or all out
      const uint4 q = *reinterpret_cast<const uint4*>(src + c * rows + r);
      const float s = scale_value(sc[c * (rows / kBlock) + r / kBlock]);
      const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
      for (int i = 0; i < 16; ++i) v[i] = lut[(w[i / 4] >> (8 * (i % 4))) & 0xFFu] * s;
    } else {
#pragma unroll
      for (int i = 0; i < 16; ++i) v[i] = 0.f;
    }
#pragma unroll
    for (int i = 0; i < 16; ++i) tile[16 * seg + i][j] = v[i];
  }
  __syncthreads();
  cuda::bf16* dst = out + b * rows * cols;
  const int q = t % 16;  // output columns c0 + 4q .. +3
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int i = t / 16 + 16 * k;  // output row r0 + i
    const int64_t r = r0 + i, c = c0 + 4 * q;
    if (r >= rows || c >= cols) continue;
    const float* e = &tile[i][4 * q];
    if (vec && c + 3 < cols) {
      uint2 o;
      o.x = pack2(e[0], e[1]);
      o.y = pack2(e[2], e[3]);
      *reinterpret_cast<uint2*>(dst + r * cols + c) = o;
    } else {
      for (int m = 0; m < 4 && c + m < cols; ++m) dst[r * cols + c + m] = __float2bfloat16_rn(e[m]);
    }
  }
}

}  // namespace

void dequantize_cuda(CudaOps& ops, const MxView& q, const Tensor& out) {
  const char* op = "mxfp8::dequantize_cuda";
  check_shape(q.batch, q.rows, q.cols, q.dir, op);
  if (q.device != Device::CUDA) throw std::invalid_argument(std::string(op) + ": q is not a CUDA view");
  if (out.device != Device::CUDA || out.dtype != DType::BF16 || out.numel() != q.data_bytes())
    throw std::invalid_argument(std::string(op) + ": out must be a CUDA BF16 tensor of " +
                                std::to_string(q.data_bytes()) + " elements, got " + dtype_name(out.dtype) + " " +
                                out.shape_str());
  const int64_t n = q.data_bytes();
  if (n == 0) return;
  if (!q.data || !q.scales || !out.data) throw std::invalid_argument(std::string(op) + ": missing buffers");
  cudaStream_t st = ops.ctx().stream;
  auto* o = static_cast<cuda::bf16*>(out.data);
  if (q.dir == Direction::Rowwise) {
    if (reinterpret_cast<uintptr_t>(q.data) % 16 != 0 || reinterpret_cast<uintptr_t>(out.data) % 16 != 0)
      throw std::invalid_argument(std::string(op) + ": data and out must be 16-byte aligned");
    const int64_t n16 = n / 16;  // n is a multiple of 32
    const int64_t blocks = std::min<int64_t>((n16 + 255) / 256, static_cast<int64_t>(ops.ctx().num_sms) * 16);
    dequant_rowwise_kernel<<<static_cast<unsigned>(blocks), 256, 0, st>>>(q.data, q.scales, q.format, n16, o);
  } else {
    if (q.batch > 65535 || (q.cols + kColTile - 1) / kColTile > 65535)
      throw std::invalid_argument(std::string(op) + ": too many columns or batch entries");
    if (reinterpret_cast<uintptr_t>(q.data) % 16 != 0)
      throw std::invalid_argument(std::string(op) + ": data must be 16-byte aligned");
    const dim3 grid(static_cast<unsigned>((q.rows + kColTile - 1) / kColTile),
                    static_cast<unsigned>((q.cols + kColTile - 1) / kColTile), static_cast<unsigned>(q.batch));
    const bool vec = q.cols % 4 == 0 && reinterpret_cast<uintptr_t>(out.data) % 8 == 0;
    dequant_colwise_kernel<<<grid, 256, 0, st>>>(q.data, q.scales, q.format, q.rows, q.cols, vec, o);
  }
  cuda::check_launch(op);
}

}  // namespace mxt::mxfp8
