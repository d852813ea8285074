#pragma once
// MXFP8 (OCP Microscaling as NVIDIA implements it; see shared/docs/mxfp8.md): blocks of 32 values along the
// GEMM contraction dim, each value FP8 (E4M3, max 448, or E5M2, max 57344), one E8M0 scale 2^(e-127) per block.
//
// The bit-level rules (scale rule, FP8 encode/decode) are inline __host__ __device__ functions here, so the
// CPU twin and the CUDA kernels share one source for everything but the final float -> FP8 rounding, which
// the GPU does with the hardware cvt (tested against `encode` over all 2^32 inputs).
//
// Layouts. A quantised copy of a high-precision tensor x [batch, rows, cols] (batch: independent matrices,
// e.g. one per expert) is a "K-major operand": a matrix [op_rows, op_k] per batch entry whose contraction
// dim op_k is contiguous and cut into blocks of 32:
//   Rowwise     blocks along cols: data [batch][rows][cols], scales [batch][rows][cols/32]; x(r,c) = op(r,c)
//   Columnwise  blocks along rows, stored TRANSPOSED: data [batch][cols][rows], scales [batch][cols][rows/32];
//               x(r,c) = op(c,r). Hopper's FP8 MMA wants both operands K-major, so the transposed copy is what
//               dgrad (W along `out`) and wgrad (dY and X along tokens) read directly.
// Partial blocks are rejected: the blocked dim (cols for rowwise, rows for columnwise) must be a multiple of
// 32, as in Transformer Engine's MXFP8 recipe (token counts are padded to 32 by the caller); the other dim is
// free.
//
// Special values (mxfp8.md fixes the scales; the element rules are ours and match the hardware cvt):
//   - amax is the NaN-propagating max of |x| (taken on the bit patterns), so a block holding a NaN gets scale
//     0xFF and every element of it is encoded as NaN (0x7F): the whole block dequantises to NaN.
//   - a block holding +-Inf (and no NaN) gets scale 0xFE (2^127); the Inf elements saturate to +-max, which
//     dequantises to +-Inf again (max x 2^127 overflows fp32); finite neighbours are multiplied by 2^-127
//     and mostly flush to (signed) zero.
//   - elements round to nearest even and saturate to +-max (never NaN); -0 and negative underflow give -0.
//   - fp32 subnormal inputs are handled exactly (no flush-to-zero anywhere): amax == 0 gives scale 0x00
//     (2^-127) and multiplier 2^127, so blocks of fp32 subnormals keep 4 significant bits.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "mxtrain/tensor.hpp"

#if defined(__CUDACC__)
#define MXT_HD __host__ __device__ __forceinline__
#else
#define MXT_HD inline
#endif

namespace mxt::mxfp8 {

constexpr int kBlock = 32;

enum class Format : uint8_t { E4M3, E5M2 };
enum class Direction : uint8_t { Rowwise, Columnwise };

const char* format_name(Format f);
const char* direction_name(Direction d);
// fp8_config.fp8_format -> the format of forward tensors (activations, weights) and of gradients:
// "E4M3": E4M3 for both; "HYBRID": E4M3 forward, E5M2 gradients. Throws naming the key on anything else.
Format forward_format(const std::string& fp8_format);
Format gradient_format(const std::string& fp8_format);

// ---- bit-level rules (shared by host and device) -------------------------------------------------------

MXT_HD uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
MXT_HD float bits_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

MXT_HD float format_max(Format f) { return f == Format::E4M3 ? 448.0f : 57344.0f; }
// The fp32 reciprocal of the max (correctly rounded at compile time), multiplied in as TE does.
MXT_HD float format_inv_max(Format f) { return f == Format::E4M3 ? 1.0f / 448.0f : 1.0f / 57344.0f; }
MXT_HD uint8_t format_max_code(Format f) { return f == Format::E4M3 ? 0x7E : 0x7B; }
constexpr uint8_t kNaNCode = 0x7F;  // a NaN in both formats (E4M3 S.1111.111, E5M2 S.11111.11)

// |x| as bits: ordered like |x| for non-NaN values, and every NaN sorts above +Inf, so an integer max over a
// block is a NaN-propagating amax.
MXT_HD uint32_t abs_bits(float x) { return f32_bits(x) & 0x7FFFFFFFu; }
constexpr uint32_t kInfBits = 0x7F800000u;

// The E8M0 block scale for a block whose amax (as abs_bits) is `amax_bits`: mxfp8.md's rule, exactly.
MXT_HD uint8_t scale_from_amax_bits(uint32_t amax_bits, Format f) {
  if (amax_bits > kInfBits) return 0xFF;   // NaN
  if (amax_bits == 0) return 0x00;         // all zero
  const float t = bits_f32(amax_bits) * format_inv_max(f);
  const uint32_t tb = f32_bits(t);
  if (tb == kInfBits) return 0xFE;         // +Inf
  uint32_t e = tb >> 23;                   // t >= 0: no sign bit
  const uint32_t m = tb & 0x7FFFFFu;
  if (m != 0 && e != 0xFE && !(e == 0 && m <= 0x400000u)) e += 1;  // round the scale up
  return static_cast<uint8_t>(e);
}

// 2^(e-127) as fp32 (e == 0 is the subnormal 2^-127); NaN for 0xFF.
MXT_HD float scale_value(uint8_t e) {
  if (e == 0xFF) return bits_f32(0x7FC00000u);
  return e == 0 ? bits_f32(0x00400000u) : bits_f32(static_cast<uint32_t>(e) << 23);
}
// The multiplier 2^(127-e) applied before rounding to FP8 (e = 254 gives the subnormal 2^-127). e != 0xFF.
MXT_HD float quant_multiplier(uint8_t e) {
  return e == 0xFE ? bits_f32(0x00400000u) : bits_f32(static_cast<uint32_t>(254 - e) << 23);
}

// float -> FP8 with round-to-nearest-even and saturation to +-max (Inf included); NaN -> 0x7F; the sign of
// zero results is kept. Works from the fp32 bits: the value m * 2^(E-23) (m the 24-bit significand) is
// rounded to a multiple of the FP8 quantum at its exponent, 2^(max(E, emin) - mant_bits).
MXT_HD uint8_t encode(float x, Format f) {
  const int mant = f == Format::E4M3 ? 3 : 2;
  const int bias = f == Format::E4M3 ? 7 : 15;
  const int emax = f == Format::E4M3 ? 8 : 15;  // exponent of the largest finite binade
  const uint8_t maxc = format_max_code(f);
  const uint32_t u = f32_bits(x);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > kInfBits) return kNaNCode;
  const int ebits = static_cast<int>(a >> 23);
  if (ebits == 0) return sign;  // fp32 zero or subnormal: far below half the smallest FP8 subnormal
  const int E = ebits - 127;
  if (E > emax) return static_cast<uint8_t>(sign | maxc);  // >= 2^(emax+1), Inf included: saturate
  const uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
  const int emin = 1 - bias;
  const int eeff = E > emin ? E : emin;
  const int shift = eeff - mant - (E - 23);  // >= 23 - mant
  uint32_t r;
  if (shift >= 25) {
    r = 0;  // m < 2^24 <= half a quantum
  } else {
    r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
  }
  // r * 2^(eeff - mant): code = ((eeff + bias - 1) << mant) + r covers subnormals (eeff = emin, r < 2^mant),
  // normals (the implicit bit carries into the exponent field) and a rounding carry into the next binade.
  uint32_t code = (static_cast<uint32_t>(eeff + bias - 1) << mant) + r;
  if (code > maxc) code = maxc;
  return static_cast<uint8_t>(sign | code);
}

// FP8 -> float, exact. E4M3 has no Inf (S.1111.111 is NaN); E5M2 has Inf (S.11111.00) and NaNs.
MXT_HD float decode(uint8_t q, Format f) {
  const int mant = f == Format::E4M3 ? 3 : 2;
  const int bias = f == Format::E4M3 ? 7 : 15;
  const uint32_t sign = static_cast<uint32_t>(q & 0x80u) << 24;
  const uint32_t ef = (q & 0x7Fu) >> mant, mf = q & ((1u << mant) - 1u);
  if (f == Format::E4M3 && (q & 0x7Fu) == 0x7Fu) return bits_f32(0x7FC00000u | sign);
  if (f == Format::E5M2 && ef == 31) return bits_f32((mf ? 0x7FC00000u : kInfBits) | sign);
  if (ef == 0) {  // subnormal: mf * 2^(1 - bias - mant), exact in fp32
    const float v = static_cast<float>(mf) * bits_f32(static_cast<uint32_t>(127 + 1 - bias - mant) << 23);
    return bits_f32(f32_bits(v) | sign);
  }
  return bits_f32(sign | ((ef - bias + 127) << 23) | (mf << (23 - mant)));
}

// ---- quantised tensors -------------------------------------------------------------------------------

// Non-owning view of one MXFP8 copy (host or device memory); see the layouts above.
struct MxView {
  uint8_t* data = nullptr;
  uint8_t* scales = nullptr;
  int64_t batch = 1, rows = 0, cols = 0;  // shape of the high-precision tensor
  Format format = Format::E4M3;
  Direction dir = Direction::Rowwise;
  Device device = Device::CPU;

  // As a K-major GEMM operand: [batch][op_rows][op_k], op_k blocked by 32.
  int64_t op_rows() const { return dir == Direction::Rowwise ? rows : cols; }
  int64_t op_k() const { return dir == Direction::Rowwise ? cols : rows; }
  int64_t data_bytes() const { return batch * rows * cols; }
  int64_t scale_bytes() const { return batch * op_rows() * (op_k() / kBlock); }
  // Offsets of logical element (b, r, c) and of its block scale.
  int64_t data_index(int64_t b, int64_t r, int64_t c) const {
    return dir == Direction::Rowwise ? (b * rows + r) * cols + c : (b * cols + c) * rows + r;
  }
  int64_t scale_index(int64_t b, int64_t r, int64_t c) const {
    return dir == Direction::Rowwise ? (b * rows + r) * (cols / kBlock) + c / kBlock
                                     : (b * cols + c) * (rows / kBlock) + r / kBlock;
  }
};

// Throws std::invalid_argument (naming `op`) unless the shape can hold an MXFP8 copy in direction d: sizes
// >= 0, batch >= 1, and the blocked dim a multiple of 32.
void check_shape(int64_t batch, int64_t rows, int64_t cols, Direction d, const char* op);

// Owning host copy.
struct MxHost {
  std::vector<uint8_t> data, scales;
  int64_t batch = 1, rows = 0, cols = 0;
  Format format = Format::E4M3;
  Direction dir = Direction::Rowwise;

  MxHost() = default;
  MxHost(int64_t batch, int64_t rows, int64_t cols, Format f, Direction d);  // checks the shape
  MxView view();
  MxView view() const;  // data is not written through a view of a const MxHost
};

// ---- CPU twin ----------------------------------------------------------------------------------------

// Quantises x [batch, rows, cols] (row-major, fp32) into the rowwise and / or columnwise copies (either may be
// null, not both), reading each 32-row strip of x once for both. Each view must be a CPU view of x's shape;
// its format says E4M3 or E5M2 (the two may differ).
void quantize(const float* x, int64_t batch, int64_t rows, int64_t cols, const MxView* rowwise,
              const MxView* colwise);
// The same from bf16 bits (widened exactly to fp32).
void quantize_bf16(const uint16_t* x, int64_t batch, int64_t rows, int64_t cols, const MxView* rowwise,
                   const MxView* colwise);

// x(b, r, c) = decode(q) * 2^(e-127), in the logical layout [batch, rows, cols]. Exact in fp32 (every FP8
// value times a scale that occurs is representable) except an Inf block's saturated elements, which give
// +-Inf, and NaN blocks.
float dequantize_at(const MxView& q, int64_t b, int64_t r, int64_t c);
std::vector<float> dequantize(const MxView& q);

// ---- cuBLASLt's block-scale layout (Blackwell's VEC32_UE8M0 mode; mxfp8.md) ---------------------------
// cuBLASLt reads an operand's scales, a [rows, C = K/32] matrix (rows: the operand's non-K dim), as 512-byte
// tiles of 128 rows x 4 scale columns, the tiles row-major over (rows/128, C/4) and each tile interleaved so
// that 32-row groups sit side by side; both dims padded (rows to 128, C to 4), padding bytes zero here.
MXT_HD int64_t tiled_scale_offset(int64_t r, int64_t c, int64_t C) {
  const int64_t col_tiles = (C + 3) / 4;
  return ((r / 128) * col_tiles + c / 4) * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 + c % 4;
}
MXT_HD int64_t tiled_scale_bytes(int64_t rows, int64_t C) { return (rows + 127) / 128 * 128 * ((C + 3) / 4 * 4); }
// CPU twin of the device tiling: scales [batch][rows][C] (an MxView's own order) -> out, batch entries one
// after the other, tiled_scale_bytes(rows, C) each, padding zeroed.
void tile_scales(const uint8_t* scales, int64_t batch, int64_t rows, int64_t C, uint8_t* out);

// ---- GEMM references (fp64, on dequantised operands) ---------------------------------------------------
// Operands are K-major views (any direction): A [a.batch][M][K], B [b.batch][N][K] as op_rows x op_k.

// C[m][n] = sum_k A_ab(m, k) * B_bb(n, k) for batch entries ab of A and bb of B; C [M, N].
std::vector<double> gemm_ref(const MxView& A, int64_t ab, const MxView& B, int64_t bb);
// Grouped along M (forward, dgrad): rows m in [off[e], off[e+1]) of A (batch 1) use B's batch entry e;
// rows past off[E] are zero. off has B.batch + 1 entries. C [M, N].
std::vector<double> grouped_gemm_ref(const MxView& A, const MxView& B, const std::vector<int32_t>& off);
// Grouped along K (wgrad): C[e] = sum over k in [off[e], off[e+1]) of A(:, k) B(:, k)^T for A, B of batch 1;
// off has E + 1 entries. C [E, M, N].
std::vector<double> grouped_gemm_wgrad_ref(const MxView& A, const MxView& B, const std::vector<int32_t>& off);

}  // namespace mxt::mxfp8
