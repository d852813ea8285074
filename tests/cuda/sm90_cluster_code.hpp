#pragma once
// The grouped GEMM's cluster arrangements as one number, for tests and benches that loop over them: 1 = one CTA,
// 2 = CTA pairs with the wgrad's pairs over n-tiles (sharing dy), 3 = CTA pairs with the wgrad's pairs over m-tiles
// (sharing x; where the m-tiles pair evenly, else over n-tiles).
#include "sm90_grouped_gemm.cuh"

namespace mxt::sm90 {

inline void use_cluster_code(int code) {
  set_grouped_cluster(code == 3 ? 2 : code);
  set_grouped_wgrad_pair(code == 3 ? 1 : 0);
}

inline const char* cluster_code_name(int code) { return code == 3 ? "2m" : code == 2 ? "2" : "1"; }

}  // namespace mxt::sm90
