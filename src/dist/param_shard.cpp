// ZeRO-1 over the replicas of a flat parameter buffer: gradients are reduce-scattered so each replica owns
// the summed gradient of one contiguous shard, AdamW updates that shard with moments only that large, and the
// updated master weights are all-gathered back. The buffer is padded to a multiple of the group size; the
// padding's gradient is zero, so its weights stay zero.
#include <algorithm>
#include <stdexcept>
#include <vector>

#include "mxtrain/comm.hpp"

namespace mxt {

ParamShard make_param_shard(Comm* comm, int64_t numel) {
  ParamShard s;
  s.comm = comm && comm->size() > 1 ? comm : nullptr;
  const int64_t n = s.comm ? s.comm->size() : 1;
  s.numel = numel;
  s.padded = (numel + n - 1) / n * n;
  s.shard = s.padded / n;
  s.offset = s.comm ? static_cast<int64_t>(s.comm->rank()) * s.shard : 0;
  return s;
}

static void check_buffer(const ParamShard& s, const Tensor& t, const char* fn, bool any_float = false) {
  const bool type_ok = t.dtype == DType::F32 || (any_float && t.dtype == DType::BF16);
  if (t.numel() != s.padded || !type_ok)
    throw std::invalid_argument(std::string(fn) + ": expected an F32" + (any_float ? " or BF16" : "") +
                                " buffer of " + std::to_string(s.padded) + " elements, got " + dtype_name(t.dtype) +
                                " " + t.shape_str());
}

void reduce_scatter_grads(const ParamShard& s, const Tensor& grad) {
  if (!s.comm) return;
  check_buffer(s, grad, "reduce_scatter_grads");
  float* g = static_cast<float*>(grad.data);
  s.comm->reduce_scatter_sum(g, g + s.offset, s.shard, CommType::F32);
}

void start_reduce_grad_range(const ParamShard& s, const Tensor& grad, int64_t begin, int64_t end) {
  if (!s.comm || begin >= end) return;
  check_buffer(s, grad, "start_reduce_grad_range");
  if (begin < 0 || end > s.padded)
    throw std::invalid_argument("start_reduce_grad_range: [" + std::to_string(begin) + ", " + std::to_string(end) +
                                ") is outside the buffer of " + std::to_string(s.padded));
  float* g = static_cast<float*>(grad.data);
  std::vector<Comm::ReduceSpan> spans;
  for (int r = static_cast<int>(begin / s.shard); r < s.comm->size() && r * s.shard < end; ++r) {
    const int64_t lo = std::max(begin, r * s.shard), hi = std::min(end, (r + 1) * s.shard);
    if (lo < hi) spans.push_back({g + lo, hi - lo, r});
  }
  s.comm->reduce_spans(spans, CommType::F32, true);
}

void all_gather_params(const ParamShard& s, const Tensor& buf) {
  if (!s.comm) return;
  check_buffer(s, buf, "all_gather_params", true);
  char* b = static_cast<char*>(buf.data);
  s.comm->all_gather(b + s.offset * static_cast<int64_t>(dtype_size(buf.dtype)), b, s.shard, comm_type(buf.dtype));
}

}  // namespace mxt
