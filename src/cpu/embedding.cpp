// Token embedding lookup and its scatter-add backward.
#include <cstring>

#include "cpu/check.hpp"
#include "cpu/cpu_ops.hpp"

namespace mxt {

static int64_t checked_id(const int32_t* ids, int64_t t, int64_t V, const char* op) {
  const int64_t id = ids[t];
  if (id < 0 || id >= V)
    cpu::fail(op, "ids[" + std::to_string(t) + "] = " + std::to_string(id) + " outside vocab " +
                      std::to_string(V));
  return id;
}

void CpuOps::embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& out) {
  const char* op = "embedding_forward";
  const int64_t T = ids.numel(), V = table.ndim ? table.shape[0] : 0;
  const int64_t d = V ? table.numel() / V : 0;
  cpu::expect_2d(out, T, d, op, "out");
  const int32_t* id = cpu::i32(ids, op, "ids");
  const float* tab = cpu::f32(table, op, "table");
  float* o = cpu::f32(out, op, "out");
  for (int64_t t = 0; t < T; ++t)
    std::memcpy(o + t * d, tab + checked_id(id, t, V, op) * d, sizeof(float) * d);
}

void CpuOps::embedding_backward(const Tensor& ids, const Tensor& dout, const Tensor& dtable) {
  const char* op = "embedding_backward";
  const int64_t T = ids.numel(), V = dtable.ndim ? dtable.shape[0] : 0;
  const int64_t d = V ? dtable.numel() / V : 0;
  cpu::expect_2d(dout, T, d, op, "dout");
  const int32_t* id = cpu::i32(ids, op, "ids");
  const float* g = cpu::f32(dout, op, "dout");
  float* dt = cpu::f32(dtable, op, "dtable");
  for (int64_t t = 0; t < T; ++t) {
    float* row = dt + checked_id(id, t, V, op) * d;
    for (int64_t j = 0; j < d; ++j) row[j] += g[t * d + j];
  }
}

}  // namespace mxt
