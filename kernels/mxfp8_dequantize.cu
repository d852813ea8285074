// MXFP8 dequantiser (CPU twin: CpuOps::mx_dequantize over mxfp8::decode / scale_value): a copy's values as bf16
// in the logical layout [batch, rows, cols], for fp8_config.hopper_gemm=bf16, where the MXFP8 GEMMs run on the
// bf16 tensor cores over these exact values (on Hopper an exact 32-block MXFP8 GEMM is bounded by the bf16 rate
// anyway: docs/perf.md, "What limits MXFP8 on Hopper").
//
// Rowwise copies are stored in the logical layout: one thread turns 16 codes (half a block, one scale) into 16
// bf16. Columnwise copies are stored transposed ([batch][cols][rows], blocks along rows): a block of 32 x 8
// threads transposes a 32-row x 32-column tile through shared memory, reading and writing whole rows.
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

// Stored [batch][cols][rows] (rows a multiple of 32) -> out [batch][rows][cols]. Block (32, 8): tile of 32 stored
// rows (= output columns c0..c0+31) x 32 codes (= output rows r0..r0+31, one scale per stored row).
__global__ void dequant_colwise_kernel(const uint8_t* __restrict__ data, const uint8_t* __restrict__ scales,
                                       Format f, int64_t rows, int64_t cols, cuda::bf16* __restrict__ out) {
  __shared__ float lut[256];
  __shared__ float tile[32][33];
  load_lut(lut, f);
  const int64_t b = blockIdx.z;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * 32, c0 = static_cast<int64_t>(blockIdx.y) * 32;
  const int tx = threadIdx.x, ty = threadIdx.y;
  const uint8_t* src = data + b * cols * rows;
  const uint8_t* sc = scales + b * cols * (rows / kBlock);
  for (int j = ty; j < 32; j += 8) {  // stored row c0 + j, codes r0 + tx
    const int64_t c = c0 + j;
    float v = 0.f;
    if (c < cols) v = lut[src[c * rows + r0 + tx]] * scale_value(sc[c * (rows / kBlock) + r0 / kBlock]);
    tile[j][tx] = v;
  }
  __syncthreads();
  cuda::bf16* dst = out + b * rows * cols;
  for (int i = ty; i < 32; i += 8) {  // output row r0 + i, columns c0 + tx
    const int64_t c = c0 + tx;
    if (c < cols) dst[(r0 + i) * cols + c] = __float2bfloat16_rn(tile[tx][i]);
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
    if (q.batch > 65535 || (q.cols + 31) / 32 > 65535)
      throw std::invalid_argument(std::string(op) + ": too many columns or batch entries");
    const dim3 grid(static_cast<unsigned>(q.rows / 32), static_cast<unsigned>((q.cols + 31) / 32),
                    static_cast<unsigned>(q.batch));
    dequant_colwise_kernel<<<grid, dim3(32, 8), 0, st>>>(q.data, q.scales, q.format, q.rows, q.cols, o);
  }
  cuda::check_launch(op);
}

}  // namespace mxt::mxfp8
