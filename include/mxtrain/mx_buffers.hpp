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

// One layer's expert weights, quantised once per optimizer step.
struct MxExpertWeights {
  MxWeight w13, w2;  // [E, 2f, d], [E, d, f]
};

}  // namespace mxt
