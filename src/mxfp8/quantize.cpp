// CPU twin of the MXFP8 quantiser and the dequantiser. The quantiser walks x in 32 x 32 tiles (the same
// tiling as kernels/mxfp8_quantize.cu): each tile is read once and feeds 32 rowwise blocks (one per row) and
// 32 columnwise blocks (one per column).
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "mxtrain/mxfp8.hpp"

namespace mxt::mxfp8 {

namespace {

// One block of n <= 32 values (the rest of a 32-block never exists: shapes are checked). Writes n codes to
// out (contiguous) and returns the scale.
uint8_t quantize_block(const float* v, int n, Format f, uint8_t* out) {
  uint32_t amax = 0;
  for (int j = 0; j < n; ++j) amax = std::max(amax, abs_bits(v[j]));
  const uint8_t e = scale_from_amax_bits(amax, f);
  if (e == 0xFF) {
    std::fill(out, out + n, kNaNCode);
    return e;
  }
  const float mult = quant_multiplier(e);
  for (int j = 0; j < n; ++j) out[j] = encode(v[j] * mult, f);  // exact product (see mxfp8.hpp)
  return e;
}

void check_view(const MxView* v, int64_t batch, int64_t rows, int64_t cols, Direction want, const char* op) {
  const std::string what = std::string(op) + ": the " + direction_name(want) + " output";
  if (v->dir != want) throw std::invalid_argument(what + " view has the other direction");
  if (v->device != Device::CPU) throw std::invalid_argument(what + " is not a CPU view");
  if (v->batch != batch || v->rows != rows || v->cols != cols)
    throw std::invalid_argument(what + " has shape [" + std::to_string(v->batch) + ", " + std::to_string(v->rows) +
                                ", " + std::to_string(v->cols) + "], the input [" + std::to_string(batch) + ", " +
                                std::to_string(rows) + ", " + std::to_string(cols) + "]");
  check_shape(batch, rows, cols, want, op);
  if (v->data_bytes() > 0 && (!v->data || !v->scales)) throw std::invalid_argument(what + " has no buffers");
}

inline float widen(float x) { return x; }
inline float widen(uint16_t b) { return bits_f32(static_cast<uint32_t>(b) << 16); }

template <typename T>
void quantize_impl(const T* x, int64_t batch, int64_t rows, int64_t cols, const MxView* rw, const MxView* cw,
                   const char* op) {
  if (!rw && !cw) throw std::invalid_argument(std::string(op) + ": no output requested");
  if (rw) check_view(rw, batch, rows, cols, Direction::Rowwise, op);
  if (cw) check_view(cw, batch, rows, cols, Direction::Columnwise, op);
  if (!x && batch * rows * cols > 0) throw std::invalid_argument(std::string(op) + ": no input data");
  float tile[kBlock][kBlock];  // [row][col]
  float colbuf[kBlock];
  for (int64_t b = 0; b < batch; ++b) {
    const T* xb = x + b * rows * cols;
    for (int64_t r0 = 0; r0 < rows; r0 += kBlock) {
      const int nr = static_cast<int>(std::min<int64_t>(kBlock, rows - r0));  // < 32 only without columnwise
      for (int64_t c0 = 0; c0 < cols; c0 += kBlock) {
        const int nc = static_cast<int>(std::min<int64_t>(kBlock, cols - c0));  // < 32 only without rowwise
        for (int i = 0; i < nr; ++i)
          for (int j = 0; j < nc; ++j) tile[i][j] = widen(xb[(r0 + i) * cols + c0 + j]);
        if (rw) {
          for (int i = 0; i < nr; ++i)
            rw->scales[rw->scale_index(b, r0 + i, c0)] =
                quantize_block(tile[i], kBlock, rw->format, rw->data + rw->data_index(b, r0 + i, c0));
        }
        if (cw) {
          for (int j = 0; j < nc; ++j) {
            for (int i = 0; i < kBlock; ++i) colbuf[i] = tile[i][j];
            cw->scales[cw->scale_index(b, r0, c0 + j)] =
                quantize_block(colbuf, kBlock, cw->format, cw->data + cw->data_index(b, r0, c0 + j));
          }
        }
      }
    }
  }
}

}  // namespace

void quantize(const float* x, int64_t batch, int64_t rows, int64_t cols, const MxView* rowwise,
              const MxView* colwise) {
  quantize_impl(x, batch, rows, cols, rowwise, colwise, "mxfp8::quantize");
}

void quantize_bf16(const uint16_t* x, int64_t batch, int64_t rows, int64_t cols, const MxView* rowwise,
                   const MxView* colwise) {
  quantize_impl(x, batch, rows, cols, rowwise, colwise, "mxfp8::quantize_bf16");
}

float dequantize_at(const MxView& q, int64_t b, int64_t r, int64_t c) {
  const uint8_t e = q.scales[q.scale_index(b, r, c)];
  if (e == 0xFF) return std::nanf("");
  return decode(q.data[q.data_index(b, r, c)], q.format) * scale_value(e);
}

std::vector<float> dequantize(const MxView& q) {
  check_shape(q.batch, q.rows, q.cols, q.dir, "mxfp8::dequantize");
  if (q.device != Device::CPU) throw std::invalid_argument("mxfp8::dequantize: not a CPU view");
  std::vector<float> out(static_cast<size_t>(q.batch * q.rows * q.cols));
  size_t i = 0;
  for (int64_t b = 0; b < q.batch; ++b)
    for (int64_t r = 0; r < q.rows; ++r)
      for (int64_t c = 0; c < q.cols; ++c) out[i++] = dequantize_at(q, b, r, c);
  return out;
}

}  // namespace mxt::mxfp8
