#pragma once
// CUDA MXFP8 entry points (kernels/mxfp8_*.cu). Formats, layouts and the CPU twins: include/mxtrain/mxfp8.hpp.
// Every call runs on the CudaOps stream and does not synchronise (except the test-support probe).
#include <cstdint>
#include <vector>

#include "mxtrain/mxfp8.hpp"
#include "mxtrain/tensor.hpp"

namespace mxt {
class CudaOps;
}

namespace mxt::mxfp8 {

// Quantises x (CUDA, BF16 or F32, [rows, cols] or [batch, rows, cols]) into the rowwise and / or columnwise
// copies (CUDA views of x's shape; either may be null, not both; their formats may differ) in one pass that
// reads x once. Bit-exact with mxfp8::quantize / quantize_bf16. Data pointers must be 16-byte aligned.
void quantize_cuda(CudaOps& ops, const Tensor& x, const MxView* rowwise, const MxView* colwise);
// The same with the rowwise copy (format row_format) delivered as its values: row_values (CUDA BF16, x's numel,
// 16-byte aligned) = dequantize_cuda of that copy, bit for bit, without its codes ever reaching memory; colwise
// may be null.
void quantize_values_cuda(CudaOps& ops, const Tensor& x, Format row_format, const Tensor& row_values,
                          const MxView* colwise);

// out (CUDA BF16, q.data_bytes() elements) = q's values in the logical layout [batch, rows, cols] (a columnwise
// copy is transposed back); bit-exact with mxfp8::dequantize rounded to bf16, which is exact down to 2^-133.
void dequantize_cuda(CudaOps& ops, const MxView& q, const Tensor& out);

// MXFP8 grouped GEMMs (kernels/mxfp8_grouped_gemm*.cu; fp64 twins mxfp8::grouped_gemm_ref / _wgrad_ref). A and
// B are K-major CUDA views of any direction (mxfp8.md's operand copies: forward X rowwise x W rowwise, dgrad
// dY rowwise x W columnwise, wgrad dY columnwise x X columnwise), either format each; offsets a CUDA I32
// tensor, never read on the host.
// Grouped along M: A [M, K] (batch 1), B [E][N, K]; rows m in [off[e], off[e+1]) use B's group e;
// C [M, N] BF16 or F32 is overwritten, rows past off[E] zeroed. offsets [E + 1].
void grouped_gemm_cuda(CudaOps& ops, const MxView& A, const MxView& B, const Tensor& offsets, const Tensor& C);
// Grouped along K: A [M, K], B [N, K] (batch 1); C [E, M, N] F32 += sum over k in [off[e], off[e+1]) of
// A(:, k) B(:, k)^T. Group boundaries may fall inside an MX block. offsets [E + 1].
void grouped_gemm_wgrad_cuda(CudaOps& ops, const MxView& A, const MxView& B, const Tensor& offsets,
                             const Tensor& C);

// The same contracts, always on the baseline kernels (mma.sync, any CUDA GPU): the GPU oracle of the fast path.
void grouped_gemm_baseline_cuda(CudaOps& ops, const MxView& A, const MxView& B, const Tensor& offsets,
                                const Tensor& C);
void grouped_gemm_wgrad_baseline_cuda(CudaOps& ops, const MxView& A, const MxView& B, const Tensor& offsets,
                                      const Tensor& C);

// Which kernels the two entry points use: the Hopper ones (kernels/mxfp8_grouped_gemm_sm90.cu: TMA, FP8 wgmma,
// promotion on the CUDA cores) wherever they apply (an sm_90 device and binary; E <= 256 groups; N a multiple of
// 8; K >= 32; 16-byte aligned A, B and forward C, 8-byte aligned wgrad C), the baseline elsewhere. The env var
// MXTRAIN_MXFP8_GEMM = auto (default) | sm90 | baseline, read once; set_gemm_impl overrides it in-process
// (Auto: back to the env var's choice).
enum class GemmImpl { Auto, Sm90, Baseline };
void set_gemm_impl(GemmImpl impl);
// Benchmarks, E4M3 x E4M3 only: 0 (default) = two temporaries (the next block's wgmma overlaps the previous
// block's promotion); 1 = one temporary (issue, wait, promote). Measurement only, WRONG results: 2 = acc += tmp
// without scales (one FP32 op per element); 3 = no promotion (bf16 forward / dgrad output and wgrad only); 4 = all
// scales 1.0 without loading them (what the scale loads cost); 5 = 3 and 4 together (TMA + wgmma alone).
void set_gemm_variant(int variant);
// What the last call of this thread ran: "sm90" or "baseline" (tests assert the path they meant).
const char* last_gemm_impl();
void note_gemm_impl(const char* impl);
// The sm90 launchers behind the entry points (arguments already checked): false, with nothing launched, where
// they do not apply.
bool grouped_gemm_sm90(CudaOps& ops, const MxView& A, const MxView& B, const Tensor& offsets, const Tensor& C);
bool grouped_gemm_wgrad_sm90(CudaOps& ops, const MxView& A, const MxView& B, const Tensor& offsets,
                             const Tensor& C);

// Dense MXFP8 GEMMs (one group, every row: the MXFP8 linears), with the grouped entry points' contracts for
// offsets {0, M} (forward / dgrad: C [M, N] overwritten) and {0, K} (wgrad: C [1, M, N] F32 +=), which the caller
// guarantees: `all_rows` / `all_k` are read only when the call falls back to the grouped kernels. On Blackwell
// (sm_100+) they run as cuBLASLt block-scaled GEMMs (VEC32_UE8M0 scales; kernels/mxfp8_gemm_sm100.cu), which is
// UNTESTED on a GPU: no Blackwell machine is lent here. Everywhere else, and where cuBLASLt has no algorithm,
// they are grouped_gemm_cuda / grouped_gemm_wgrad_cuda.
void dense_gemm_cuda(CudaOps& ops, const MxView& A, const MxView& B, const Tensor& all_rows, const Tensor& C);
void dense_gemm_wgrad_cuda(CudaOps& ops, const MxView& A, const MxView& B, const Tensor& all_k, const Tensor& C);
// The cuBLASLt launcher: C = A B^T + beta C (A [M, K], B [N, K], batch 1, K-major views of any direction; C
// [M, N] BF16 or F32). Returns false, with nothing launched, unless the device is sm_100+, the implementation is
// not forced to the baseline (MXTRAIN_MXFP8_GEMM / set_gemm_impl), cuBLASLt has an algorithm for the shape and
// that algorithm agreed with the baseline kernel at the shape's first eager call (a check that synchronises
// once per shape and uses `offsets`, the dense offsets {0, M} or {0, K} for beta 0 or 1).
bool dense_gemm_sm100(CudaOps& ops, const MxView& A, const MxView& B, const Tensor& C, float beta,
                      const Tensor& offsets);
// Scales [batch][rows][C] (an MxView's order) -> cuBLASLt's tiles, tiled_scale_bytes(rows, C) per batch entry,
// padding zeroed: mxfp8::tile_scales on the device. Any CUDA GPU (its test runs on Hopper).
void tile_scales_cuda(CudaOps& ops, const uint8_t* scales, int64_t batch, int64_t rows, int64_t C, uint8_t* out);
// True when MXTRAIN_MXFP8_GEMM=baseline or set_gemm_impl(Baseline) keeps every MXFP8 GEMM on the baseline.
bool baseline_forced();

// Test support: rounds every non-NaN fp32 bit pattern to FP8 both with the quantiser's hardware path (clamp to
// +-max, cvt.rn.satfinite) and with mxfp8::encode, on the device. Returns how many differ and (in `first`, if
// given) up to 16 of the differing inputs. Synchronises.
int64_t cvt_probe_cuda(CudaOps& ops, Format f, std::vector<uint32_t>* first);

}  // namespace mxt::mxfp8
