// MXFP8 tensor bookkeeping: names, the fp8_format key, shape checks, the owning host copy.
#include <stdexcept>
#include <string>

#include "mxtrain/mxfp8.hpp"

namespace mxt::mxfp8 {

const char* format_name(Format f) { return f == Format::E4M3 ? "E4M3" : "E5M2"; }
const char* direction_name(Direction d) { return d == Direction::Rowwise ? "rowwise" : "columnwise"; }

static void check_format_key(const std::string& v) {
  if (v != "E4M3" && v != "HYBRID")
    throw std::invalid_argument("fp8_config.fp8_format: expected E4M3 or HYBRID, got '" + v + "'");
}
Format forward_format(const std::string& fp8_format) {
  check_format_key(fp8_format);
  return Format::E4M3;
}
Format gradient_format(const std::string& fp8_format) {
  check_format_key(fp8_format);
  return fp8_format == "HYBRID" ? Format::E5M2 : Format::E4M3;
}

void check_shape(int64_t batch, int64_t rows, int64_t cols, Direction d, const char* op) {
  const std::string shape =
      "[" + std::to_string(batch) + ", " + std::to_string(rows) + ", " + std::to_string(cols) + "]";
  if (batch < 1 || rows < 0 || cols < 0)
    throw std::invalid_argument(std::string(op) + ": bad MXFP8 tensor shape " + shape);
  const bool row = d == Direction::Rowwise;
  const int64_t blocked = row ? cols : rows;
  if (blocked % kBlock != 0)
    throw std::invalid_argument(std::string(op) + ": the " + direction_name(d) + " MXFP8 copy of a " + shape +
                                " tensor needs " + (row ? "cols" : "rows") + " (" + std::to_string(blocked) +
                                ") to be a multiple of 32: blocks of 32 lie along the contraction dim and "
                                "partial blocks are not supported (pad it, e.g. token counts to 32)");
}

MxHost::MxHost(int64_t b, int64_t r, int64_t c, Format f, Direction d)
    : batch(b), rows(r), cols(c), format(f), dir(d) {
  check_shape(b, r, c, d, "MxHost");
  MxView v = view();
  data.assign(static_cast<size_t>(v.data_bytes()), 0);
  scales.assign(static_cast<size_t>(v.scale_bytes()), 0);
}

MxView MxHost::view() {
  MxView v;
  v.data = data.data();
  v.scales = scales.data();
  v.batch = batch;
  v.rows = rows;
  v.cols = cols;
  v.format = format;
  v.dir = dir;
  v.device = Device::CPU;
  return v;
}
MxView MxHost::view() const { return const_cast<MxHost*>(this)->view(); }

}  // namespace mxt::mxfp8
