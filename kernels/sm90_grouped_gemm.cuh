#pragma once
// Host interface of the Hopper grouped expert GEMMs (grouped_gemm_sm90.cu): which implementation the
// CudaOps::grouped_gemm* calls use, and the launchers they try before the wmma fallback. Host-only: tests and
// benchmarks include it.
//
// Selection: the env var MXTRAIN_GROUPED_GEMM = auto (default) | sm90 | tma | wmma, read once. auto / sm90 /
// tma use the sm90 kernels wherever they apply (an sm_90 device, sizes and alignments below) and the wmma kernels
// elsewhere; wmma forces the fallback (A/B tests). Tests and benchmarks can override it in-process.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

namespace mxt {
struct CudaContext;
}

namespace mxt::sm90 {

enum class GroupedImpl { Auto, Wmma, Sm90 };

// Overrides MXTRAIN_GROUPED_GEMM for this process (Auto: back to the env var's choice).
void set_grouped_impl(GroupedImpl impl);
// The N width of the sm90 block tile: 256 (default; env MXTRAIN_GG_BN) or 128. 0 restores the default.
void set_grouped_tile_n(int bn);
// CTAs per cluster: 2 (default; env MXTRAIN_GG_CLUSTER; pairs share a tile through TMA multicast: the weight tile
// in the forward and dgrad, the x tile in the wgrad, set_grouped_wgrad_pair) or 1; MXTRAIN_GG_CLUSTER_FWD / _DGRAD /
// _WGRAD override the env var for one direction. Set here, it holds for all three; 0 restores the env vars' choice.
void set_grouped_cluster(int ctas);
// Forward / dgrad epilogue: 1 = TMA stores (default; env MXTRAIN_GG_STORE=tma), 0 = direct register stores
// (MXTRAIN_GG_STORE=direct), -1 restores the env var's choice.
void set_grouped_tma_store(int on);
// Weight-gradient epilogue: 1 = TMA reduce-adds / stores through shared memory (default; env
// MXTRAIN_GG_WGRAD_EPI=tma), 0 = red.global / st.global straight from the registers (MXTRAIN_GG_WGRAD_EPI=red),
// -1 restores the env var's choice.
void set_grouped_wgrad_tma(int on);
// SwiGLU fused into the expert GEMMs' epilogues (try_grouped_fwd_swiglu, try_grouped_dgrad_swiglu): 1 = on,
// 0 = off (default; env MXTRAIN_GG_SWIGLU=separate|fused), -1 restores the env var's choice.
void set_grouped_swiglu_fusion(int on);
// Weight-gradient tail k-blocks (a row set's last of an expert): 0 = only the wgmmas over its rows, each warpgroup
// zeroing up to 15 rows of its dy chunk (default; env MXTRAIN_GG_WGRAD_TAIL=steps), 1 = zero the other rows of both
// operands, all 4 wgmmas (zero), 2 = leave them (wrong sums: timing only), -1 restores the env var's choice.
void set_grouped_wgrad_tail(int mode);
// Weight-gradient CTA pairs: 1 = over two m-tiles sharing the x tile (default; env MXTRAIN_GG_WGRAD_PAIR=m; where the
// m-tiles pair evenly, else over n-tiles), 0 = over two n-tiles sharing the dy tile (n), -1 restores the env var's
// choice.
void set_grouped_wgrad_pair(int mode);
// Weight-gradient raster: the fast index walks groups of `units` (n-tiles or m-tile pairs; 0 = one group, the plain
// raster; default: env MXTRAIN_GG_WGRAD_GROUP, else 8 for a call over several row sets and 0 for one), -1 restores
// the default.
void set_grouped_wgrad_group(int units);
// Weight-gradient schedule: 1 = the experts' items in decreasing order of their k-blocks (ties by index), so the
// static round-robin's last round is the cheapest expert's; 0 = index order (default; env
// MXTRAIN_GG_WGRAD_ORDER=index|rows), -1 restores the env var's choice. The same sums bit for bit.
void set_grouped_wgrad_order(int by_rows);
// Weight gradient storing a bf16 dW through the TMA: 1 = one named barrier per 64 x 32 box (default; env
// MXTRAIN_GG_WGRAD_EPI_BARS=1), 2 = two (2, the form before session 61), -1 restores the env var's choice. The same
// bits.
void set_grouped_wgrad_epi_bars(int bars);
// Weight gradient storing a bf16 dW through the TMA: 1 = each warp writes its rows of a 64 x 32 box by four
// stmatrix.x2 (the default; env MXTRAIN_GG_WGRAD_EPI_STORE=stmatrix), 0 = by eight st.shared.b32 (words, env
// MXTRAIN_GG_WGRAD_EPI_STORE=words), -1 restores the env var's choice. The same bits.
void set_grouped_wgrad_epi_stmatrix(int on);
// Tests: while on, each weight-gradient launch's CTA 0 writes the schedule's expert order (position -> expert) to a
// device buffer that recorded_wgrad_order reads back (after a device synchronisation).
void record_wgrad_order(bool on);
std::vector<int32_t> recorded_wgrad_order(int E);
// Weight gradient over several row sets in one launch: 1 = each set's rows of an expert past its last whole 64-row
// k-block are first copied into one extra set (gather_wgrad_tails, wgrad_tails.hpp), so each expert ends in one
// partial k-block instead of one per set (default; env MXTRAIN_GG_WGRAD_GATHER=on), 0 = they stay in place (off),
// -1 restores the env var's choice. Sums in another order: dW may differ from the in-place sums in the last bits.
void set_grouped_wgrad_gather(int on);
// Weight gradient: 1 = each CTA starts its next item only once every CTA is past the middle of its current one, so
// the CTAs sharing a dy or x strip through L2 stay close (a scheduling hint: it gives up after about 2 ms; the same
// sums bit for bit), 0 = off, -1 restores the env var's choice (MXTRAIN_GG_WGRAD_LOCKSTEP=auto|on|off; auto, the
// default: on for calls over two or more row sets).
void set_grouped_wgrad_lockstep(int on);
// L2 eviction priorities on the operand loads and output stores: a mask of the directions that use them (1 forward,
// 2 dgrad, 4 wgrad in raster groups; 0 none, the default; env MXTRAIN_GG_L2_HINTS=off|on|fwd|dgrad|wgrad), -1
// restores the env var's choice. Results are unchanged.
// Forward / dgrad: the last round of work units (fewer than the CTA pairs or CTAs in flight) split along K into at
// most `max_parts` parts each, whose fp32 partial tiles the last part to finish adds up in part order (default 8;
// env MXTRAIN_GG_TAIL_SPLIT; 0 or 1 off), -1 restores the env var's choice. Sums in another order than the unsplit
// kernel's: the outputs may differ from it in the last bf16 bit.
void set_grouped_tail_split(int max_parts);
constexpr int kL2HintsAll = 7;
void set_grouped_l2_hints(int mask);
// What the last grouped GEMM call of this thread ran: "sm90" or "wmma" (tests assert the path they meant).
const char* last_grouped_impl();
void note_grouped_impl(const char* impl);

// Launch the sm90 kernel and return true, or return false (nothing launched) when it does not apply: not
// selected, not an sm_90 device / binary, E outside [1, 256], in or out not a multiple of 8, operands not
// 16-byte aligned (dW: 8), or a tensor-map geometry the driver rejects (said once on stderr). Argument
// meanings as in CudaOps::grouped_gemm* (ops.hpp); offsets stay on the device.
bool try_grouped_fwd(const __nv_bfloat16* x, const __nv_bfloat16* W, const int32_t* offsets, int64_t E, int64_t R,
                     int64_t out, int64_t in, __nv_bfloat16* y, CudaContext& ctx);
// The forward fused with SwiGLU x routing weight: h13 = x W13[e]^T (W13 [E, 2f, in]) and act[r, i] =
// silu(h13[r, i]) * h13[r, f + i] * wp[r] (CudaOps::grouped_gemm_swiglu; f a multiple of 8; BN 256 or 128,
// never clusters). Off by default (false: the caller runs the two ops), on with MXTRAIN_GG_SWIGLU=fused or
// set_grouped_swiglu_fusion(1): on an H200 the un-overlapped epilogue costs more than the separate kernels.
bool try_grouped_fwd_swiglu(const __nv_bfloat16* x, const __nv_bfloat16* W13, const int32_t* offsets, int64_t E,
                            int64_t R, int64_t f, int64_t in, const float* wp, __nv_bfloat16* h13,
                            __nv_bfloat16* act, CudaContext& ctx);
// The dgrad through W2 [E, out, f] fused with the SwiGLU backward: dh13 [R, 2f] and dwp [R] from dy [R, out],
// h13 and wp (CudaOps::grouped_gemm_dgrad_swiglu); part: scratch for R x ceil(f / BN) floats (false when
// part_floats is less).
bool try_grouped_dgrad_swiglu(const __nv_bfloat16* dy, const __nv_bfloat16* W2, const int32_t* offsets, int64_t E,
                              int64_t R, int64_t out, int64_t f, const __nv_bfloat16* h13, const float* wp,
                              __nv_bfloat16* dh13, float* dwp, float* part, int64_t part_floats, CudaContext& ctx);
bool try_grouped_dgrad(const __nv_bfloat16* dy, const __nv_bfloat16* W, const int32_t* offsets, int64_t E,
                       int64_t R, int64_t out, int64_t in, __nv_bfloat16* dx, CudaContext& ctx);
// One row set of the weight gradient (e.g. one micro-batch's): dy [R, out], x [R, in] and its expert offsets.
struct WgradRows {
  const __nv_bfloat16* dy;
  const __nv_bfloat16* x;
  const int32_t* offsets;
  int64_t R;
};
// dW[e] += (accumulate) or = (not: experts without rows get zeros) the sum over the sets, in order, of
// dy_e^T x_e: each output tile contracts every set's rows of its expert before its one read-add-write or store.
// Sets need R >= 1. Up to 8 sets (fewer at E > 64) run in one launch, more in several; where 2 or more run in one,
// their tails are gathered first (set_grouped_wgrad_gather) into ctx's "wgrad_tails" scratch.
// With sumsq (accumulate false, at least wgrad_norm_slots floats): also each stored tile's sum of squares, per
// consumer warp, into sumsq[0, wgrad_norm_slots) (their sum is sum(dW^2)); false (nothing launched) when the call
// would not be one storing launch.
// With dW_bf16, dW is bf16 and stored (accumulate false, one launch, in a multiple of 8), each element the whole
// fp32 sum rounded to nearest even; the sums of squares are of the rounded values.
bool try_grouped_wgrad(const WgradRows* sets, int nsets, int64_t E, int64_t out, int64_t in, void* dW,
                       CudaContext& ctx, bool accumulate = true, float* sumsq = nullptr, int64_t sumsq_slots = 0,
                       bool dW_bf16 = false);
int64_t wgrad_norm_slots(int64_t E, int64_t out, int64_t in);
// Diagnostic builds (-DMXTRAIN_GG_CLOCKS) only: the weight gradient's consumer cycles since the last take, per
// warpgroup {first k-block wait, rest of mainloop, its k-block waits, epilogue, items, the epilogue's waits for the
// TMA to have read a box, the first k-block's part before its wait}; false in other builds.
bool grouped_clocks_take(unsigned long long out[14]);

}  // namespace mxt::sm90
