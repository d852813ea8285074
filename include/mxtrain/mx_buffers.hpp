#pragma once
// MXFP8 copies planned in an Arena (fp8_config.enabled): raw code and scale bytes with a capacity, shaped into
// an mxfp8::MxView where they are used, so one buffer can hold copies of different shapes over a step.
#include <cstdint>
#include <string>

#include "mxtrain/arena.hpp"
#include "mxtrain/mxfp8.hpp"
#include "mxtrain/tensor.hpp"

namespace mxt {

struct MxBuf {
  Tensor data, scales;  // U8: codes, E8M0 scales (one per 32 codes)
  // Registers room for `elems` codes (and their scales) in the arena; slots must outlive finalize().
  void plan(Arena& arena, const std::string& name, int64_t elems);
  // A view of this buffer as the copy of a [batch, rows, cols] tensor; throws if it does not fit.
  mxfp8::MxView view(int64_t batch, int64_t rows, int64_t cols, mxfp8::Format f, mxfp8::Direction d) const;
};

// A weight's two E4M3 copies: rowwise (forward, blocks along `in`) and columnwise (dgrad, along `out`).
struct MxWeight {
  MxBuf row, col;
  int64_t batch = 1, rows = 0, cols = 0;  // the weight's shape ([E,] out, in)
  // fp8_config.hopper_gemm=bf16: each copy's values in the weight's own layout [batch, rows, cols] (act dtype),
  // which the GEMMs read instead of the codes (empty otherwise).
  Tensor deq_row, deq_col;
  void plan_deq(Arena& arena, const std::string& name, DType dtype, bool with_row, bool with_col);
  // Plans the rowwise and / or the columnwise copy (an unplanned one is empty until assigned a planned buffer).
  void plan(Arena& arena, const std::string& name, int64_t batch, int64_t rows, int64_t cols, bool with_row = true,
            bool with_col = true);
  mxfp8::MxView rowwise() const;
  mxfp8::MxView colwise() const;
};

class Ops;
// fp8_config.hopper_gemm=bf16: v's values as a [v.rows, v.cols] tensor at the start of buf (act dtype, batch 1).
Tensor mx_dequantized(Ops& ops, const mxfp8::MxView& v, const Tensor& buf);

// A GEMM's A operand made from an activation's rowwise copy: its codes q, or (hopper_gemm=bf16) its values, made
// by mx_quantize_values without codes. rows x cols: the operand's shape (q's rows may be padded past it).
struct MxRows {
  mxfp8::MxView q;
  Tensor values;  // [rows, cols] when set; q is then unused
  // The first n rows (a prefix of the rowwise layout either way).
  MxRows first(int64_t n) const;
};
// x's rows [0, rows) quantised in one pass: the rowwise copy as a GEMM's A, as codes in row or (values_buf given:
// hopper_gemm=bf16 with mx_row_values()) as its values [rows, cols] at the start of *values_buf; and the
// columnwise copy into *colwise if given (a view of that shape).
MxRows mx_quantize_rows(Ops& ops, const Tensor& x, int64_t rows, int64_t cols, mxfp8::Format f, const MxBuf& row,
                        const Tensor* values_buf, const mxfp8::MxView* colwise);
// The operand's values: a's own, or its codes dequantised into buf.
Tensor mx_values(Ops& ops, const MxRows& a, const Tensor& buf);
// Whether hopper_gemm=bf16 quantises activations straight to rowwise values (default, env MXTRAIN_MX_ROW_VALUES=1),
// or writes their rowwise codes and dequantises them per GEMM (MXTRAIN_MX_ROW_VALUES=0). The same numbers either
// way; since session 22's staged values the one pass runs at 1.05x the two, +0.9% end to end (docs/perf.md).
bool mx_row_values();
// Overrides the env var in this process: 1 = values, 0 = codes, -1 = back to the env var (tests).
void set_mx_row_values(int on);

// One layer's expert weights, quantised once per optimizer step.
struct MxExpertWeights {
  MxWeight w13, w2;  // [E, 2f, d], [E, d, f]
};

}  // namespace mxt
