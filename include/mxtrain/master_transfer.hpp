#pragma once
// An fp32 master held split (optimizer_store_param_remainders: the bf16 working copy hi + the I16 remainders rem,
// mxtrain/bf16.hpp's split_master) to or from host F32: elements [from, from + n) joined or split on the host, in
// bounded chunks. Set-up, export and checkpoints use these; src/core/f32_transfer.cpp.
#include <cstdint>

#include "mxtrain/ops.hpp"

namespace mxt {

void download_joined(Ops& ops, const void* hi, const void* rem, int64_t from, int64_t n, float* dst);
void upload_split(Ops& ops, void* hi, void* rem, int64_t from, int64_t n, const float* src);

}  // namespace mxt
