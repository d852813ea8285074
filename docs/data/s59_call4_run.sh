#!/usr/bin/env bash
# Session 59, call 4 (H200): main with the weight gradient's raster in groups of 8 by default for calls over
# several row sets (the trainer's expert_wgrad_micro_batches call; calls 2-3 measured it as MXTRAIN_GG_WGRAD_GROUP=8).
#  1. every CUDA test (the raster-group test now also runs groups of 8 and the default's choice);
#  2. issue 4's 8x7B figure beside HF on this build;  3. the new default / the plain raster (MXTRAIN_GG_WGRAD_GROUP=0).
set -u
export CALL_END=${CALL_END:-380}
source scripts/device_call_lib.sh
call_begin s59c4
step 150 tests_all -- m/main/mxtrain_tests --gtest_filter='*Cuda*:*Gpu*:*Mxfp8*:-Binary.*'
trainer 250 hf_def 8x7B-2layer --hf
for r in 1 2; do
  trainer 330 def_$r 8x7B-2layer
  trainer 340 plain_$r 8x7B-2layer MXTRAIN_GG_WGRAD_GROUP=0
done
call_end
for f in $W/tr_*.txt; do echo "$(basename $f .txt) $(head -1 $f | cut -c1-150)"; done
