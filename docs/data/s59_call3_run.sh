#!/usr/bin/env bash
# Session 59, call 3 (H200), the same binaries as call 2. Call 2: MXTRAIN_GG_WGRAD_GROUP=8 (the weight gradient's
# raster in groups of 8 fast units) +0.3% at 8x7B over four alternating rounds, lockstep off -1%. Here:
#  1. the single wgrad call storing bf16 with the raster in groups of 8, beside cuBLASLt storing bf16;
#  2. 8x1B default / groups of 8, three rounds;  3. 8x7B with groups of 8 beside HF.
set -u
source scripts/device_call_lib.sh
call_begin s59c3
step 80 gg_wgrad_g8 MXTRAIN_GG_WGRAD_GROUP=8 -- m/main/bench_grouped_gemm --no-wmma --shape 8x7B --ops wgrad --runs 12
for r in 1 2 3; do
  trainer 300 b1_def_$r 8x1B
  trainer 300 b1_grp8_$r 8x1B MXTRAIN_GG_WGRAD_GROUP=8
done
trainer 330 hf_grp8 8x7B-2layer --hf MXTRAIN_GG_WGRAD_GROUP=8
call_end
grep -h "rotating" $W/gg_wgrad_g8.txt | sed 's/ \+/ /g' | cut -c1-170
for f in $W/tr_*.txt; do echo "$(basename $f .txt) $(head -1 $f | cut -c1-140)"; done
