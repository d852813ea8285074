#!/usr/bin/env bash
# Session 69, call 3 (H200, needs_h200): is the experts-by-rows wgrad order worth making the default?
#  1. the single wgrad call beside cuBLASLt, 24 runs (its rotation holds the by-rows variant);
#  2. 8x7B 2 layers, ours only, index order / rows order (MXTRAIN_GG_WGRAD_ORDER) alternating, three rounds.
set -u
BIN=m/wip
CALL_END=${CALL_END:-250}
source scripts/device_call_lib.sh
call_begin s69c3
step 110 gg_wgrad -- m/wip/bench_grouped_gemm --no-wmma --shape 8x7B --ops wgrad --runs 24
for r in 1 2 3; do
  trainer 240 index_$r 8x7B-2layer MXTRAIN_GG_WGRAD_ORDER=index
  trainer 240 rows_$r 8x7B-2layer MXTRAIN_GG_WGRAD_ORDER=rows
done
call_end
grep -h 'rotating' "$W/gg_wgrad.txt" | grep -v '^|' | sed 's/ \+/ /g' | cut -c1-110
trainer_summary
