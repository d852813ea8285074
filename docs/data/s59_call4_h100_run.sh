#!/usr/bin/env bash
# Session 59, call 4 on an H100 (the H200 did not start; 481 s of device time left): c3eb28d's build, the wgrad
# raster in groups of 8 by default over several row sets.
#  1. every CUDA test;  2. the 8x7B layer shape with 1 layer (2 do not fit 80 GB): the new default / the plain
#  raster (MXTRAIN_GG_WGRAD_GROUP=0), alternating, three rounds.
set -u
export CALL_END=${CALL_END:-300}
source scripts/device_call_lib.sh
call_begin s59c4h
step 150 tests_all -- m/main/mxtrain_tests --gtest_filter='*Cuda*:*Gpu*:*Mxfp8*:-Binary.*'
L1=(--set config_kwargs.num_hidden_layers=1)
for r in 1 2 3; do
  trainer 270 def_$r 8x7B-2layer "${L1[@]}"
  trainer 280 plain_$r 8x7B-2layer "${L1[@]}" MXTRAIN_GG_WGRAD_GROUP=0
done
call_end
grep -h "FAILED\|remainders\]" $W/tests_all.txt | head
for f in $W/tr_*.txt; do echo "$(basename $f .txt) $(head -1 $f | cut -c1-110)"; done
