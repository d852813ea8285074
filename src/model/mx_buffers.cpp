#include "mxtrain/mx_buffers.hpp"

#include <atomic>
#include <cstdlib>
#include <stdexcept>
#include <string>

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

MxRows MxRows::first(int64_t n) const {
  MxRows a = *this;
  if (a.values.data) a.values = a.values.rows(0, n);
  else a.q.rows = n;
  return a;
}

MxRows mx_quantize_rows(Ops& ops, const Tensor& x, int64_t rows, int64_t cols, mxfp8::Format f, const MxBuf& row,
                        const Tensor* values_buf, const mxfp8::MxView* colwise) {
  MxRows a;
  if (values_buf) {
    a.values = values_buf->rows(0, rows * cols).view({rows, cols});
    ops.mx_quantize_values(x.rows(0, rows), f, a.values, colwise);
  } else {
    a.q = row.view(1, rows, cols, f, mxfp8::Direction::Rowwise);
    ops.mx_quantize(x.rows(0, rows), &a.q, colwise);
  }
  return a;
}

namespace {
std::atomic<int> g_row_values{-1};
}

void set_mx_row_values(int on) { g_row_values.store(on < 0 ? -1 : on ? 1 : 0); }

bool mx_row_values() {
  const int o = g_row_values.load();
  if (o >= 0) return o == 1;
  static const bool v = [] {
    const char* s = std::getenv("MXTRAIN_MX_ROW_VALUES");
    if (s == nullptr || *s == 0 || std::string(s) == "1") return true;
    if (std::string(s) == "0") return false;
    throw std::invalid_argument(std::string("MXTRAIN_MX_ROW_VALUES must be 0 or 1, got '") + s + "'");
  }();
  return v;
}

Tensor mx_values(Ops& ops, const MxRows& a, const Tensor& buf) {
  return a.values.data ? a.values : mx_dequantized(ops, a.q, buf);
}

mxfp8::MxView MxWeight::rowwise() const {
  return row.view(batch, rows, cols, mxfp8::Format::E4M3, mxfp8::Direction::Rowwise);
}
mxfp8::MxView MxWeight::colwise() const {
  return col.view(batch, rows, cols, mxfp8::Format::E4M3, mxfp8::Direction::Columnwise);
}

}  // namespace mxt
