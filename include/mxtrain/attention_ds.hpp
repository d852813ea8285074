#pragma once
// The attention backward's dS tiles (Hopper, head_dim 64 and 128): the dK/dV kernel stores each dS^T block it computes,
// and dQ = scale dS K is then one product per block instead of recomputing S, P and dP (attention_dq_ds_sm90.cu).
// Pure C++ (the memory plan and host tests use it; MXT_HOST_DEVICE marks what device code calls as well).
//
// Layout: per (batch row, head), the [64 keys][64 queries] bf16 tiles of key block kb (64 keys) and query block qb
// with qb >= 2 * floor(kb / 2): the blocks the dK/dV kernel visits (its CTAs take 128 keys and every 64-query
// block from their first key on, the diagonal's masked half included). Key block kb holds nb - 2 * floor(kb / 2)
// tiles, qb ascending; the key blocks follow each other, nb = S / 64 (even: S is a multiple of 128).
#include <cstdint>
#include <string>

#include "mxtrain/host_device.hpp"

namespace mxt {

// Tiles of one (batch row, head): nb^2 / 2 + nb.
MXT_HOST_DEVICE inline int64_t attention_ds_tiles_per_head(int64_t nb) { return nb * nb / 2 + nb; }

// Index of tile (kb, qb) within its (batch row, head); needs qb >= 2 * floor(kb / 2).
MXT_HOST_DEVICE inline int64_t attention_ds_tile(int64_t nb, int64_t kb, int64_t qb) {
  const int64_t t = kb / 2, r = kb % 2;
  return 2 * t * nb - 2 * t * (t - 1) + r * (nb - 2 * t) + (qb - 2 * t);
}

// Above this the backward recomputes dQ's scores instead (seq 4096 x 32 heads takes 0.55 GB; 8192 x 32, 2.2 GB).
inline constexpr int64_t kAttentionDsMaxBytes = int64_t{1} << 31;

// Bytes the dS tiles would take for B rows of S tokens (S a multiple of 128) and H query heads.
inline int64_t attention_ds_tile_bytes(int64_t B, int64_t S, int64_t H) {
  return B * H * attention_ds_tiles_per_head(S / 64) * 64 * 64 * 2;
}

// Why the tiled path does not apply by shape to B rows of S tokens and H query heads of head_dim D, or "" where it
// does: head_dim 64 or 128, S a positive multiple of 128, at most kAttentionDsMaxBytes of tiles.
inline std::string attention_ds_why_not(int64_t B, int64_t S, int64_t H, int64_t D) {
  if ((D != 64 && D != 128) || S <= 0 || S % 128 != 0 || B <= 0 || H <= 0)
    return "head_dim " + std::to_string(D) + ", seq " + std::to_string(S) + " (needs 64 or 128 and a multiple of 128)";
  if (attention_ds_tile_bytes(B, S, H) > kAttentionDsMaxBytes)
    return "the tiles would take more than " + std::to_string(kAttentionDsMaxBytes >> 20) + " MiB";
  return "";
}

// Bytes of the dS tiles, or 0 where the tiled path does not apply by shape (attention_ds_why_not).
inline int64_t attention_ds_bytes(int64_t B, int64_t S, int64_t H, int64_t D) {
  return attention_ds_why_not(B, S, H, D).empty() ? attention_ds_tile_bytes(B, S, H) : 0;
}

}  // namespace mxt
