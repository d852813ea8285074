#include "mxtrain/mx_buffers.hpp"

#include <stdexcept>

#include "mxtrain/ops.hpp"

namespace mxt {

void MxBuf::plan(Arena& arena, const std::string& name, int64_t elems) {
  arena.add(data, name, DType::U8, {elems});
  arena.add(scales, name + ".scales", DType::U8, {(elems + mxfp8::kBlock - 1) / mxfp8::kBlock});
}

mxfp8::MxView MxBuf::view(int64_t batch, int64_t rows, int64_t cols, mxfp8::Format f, mxfp8::Direction d) const {
  mxfp8::MxView v;
  v.data = static_cast<uint8_t*>(data.data);
  v.scales = static_cast<uint8_t*>(scales.data);
  v.batch = batch;
  v.rows = rows;
  v.cols = cols;
  v.format = f;
  v.dir = d;
  v.device = data.device;
  mxfp8::check_shape(batch, rows, cols, d, "MxBuf::view");
  if (v.data_bytes() > data.numel() || v.scale_bytes() > scales.numel())
    throw std::logic_error("MxBuf::view: a [" + std::to_string(batch) + ", " + std::to_string(rows) + ", " +
                           std::to_string(cols) + "] MXFP8 copy does not fit a buffer of " +
                           std::to_string(data.numel()) + " codes");
  return v;
}

void MxWeight::plan(Arena& arena, const std::string& name, int64_t b, int64_t r, int64_t c, bool with_row,
                    bool with_col) {
  batch = b;
  rows = r;
  cols = c;
  if (with_row) row.plan(arena, name + ".mx_row", b * r * c);
  if (with_col) col.plan(arena, name + ".mx_col", b * r * c);
}

void MxWeight::plan_deq(Arena& arena, const std::string& name, DType dtype, bool with_row, bool with_col) {
  if (with_row) arena.add(deq_row, name + ".mx_row_bf16", dtype, {batch, rows, cols});
  if (with_col) arena.add(deq_col, name + ".mx_col_bf16", dtype, {batch, rows, cols});
}

Tensor mx_dequantized(Ops& ops, const mxfp8::MxView& v, const Tensor& buf) {
  const Tensor t = buf.rows(0, v.rows * v.cols).view({v.rows, v.cols});
  ops.mx_dequantize(v, t);
  return t;
}

mxfp8::MxView MxWeight::rowwise() const {
  return row.view(batch, rows, cols, mxfp8::Format::E4M3, mxfp8::Direction::Rowwise);
}
mxfp8::MxView MxWeight::colwise() const {
  return col.view(batch, rows, cols, mxfp8::Format::E4M3, mxfp8::Direction::Columnwise);
}

}  // namespace mxt
