// CPU twin of the scale tiling for cuBLASLt's VEC32_UE8M0 mode (mxtrain/mxfp8.hpp).
#include <cstring>

#include "mxtrain/mxfp8.hpp"

namespace mxt::mxfp8 {

void tile_scales(const uint8_t* scales, int64_t batch, int64_t rows, int64_t C, uint8_t* out) {
  const int64_t tiled = tiled_scale_bytes(rows, C);
  std::memset(out, 0, static_cast<size_t>(batch * tiled));
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < C; ++c) out[b * tiled + tiled_scale_offset(r, c, C)] = scales[(b * rows + r) * C + c];
}

}  // namespace mxt::mxfp8
