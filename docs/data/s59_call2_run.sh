#!/usr/bin/env bash
# Session 59, call 2 (H200). bins.tgz: main/ = this session's build (pack_devbin.sh --only
# mxtrain_tests,bench_grouped_gemm devbin/bins.tgz main=build).
#  1. the split-master GPU test with its one-step runs off warm-up (call 1: lr 0 at step 1, the weights unmoved);
#  2. the single-call wgrad storing bf16 beside cuBLASLt storing bf16, CTA pairs over m and over n, in rotation;
#  3. call 1's two knob gains (+0.25% / +0.4%, two rounds each) tried over four rounds, alternating:
#     default / MXTRAIN_GG_WGRAD_GROUP=8 / MXTRAIN_GG_WGRAD_LOCKSTEP=off / both;
#  4. the 8x7B figure beside HF again: the default, then both knobs.
set -u
source scripts/device_call_lib.sh
call_begin s59c2
step 100 tests_rem -- m/main/mxtrain_tests --gtest_filter='CudaMasterRemainders.*'
step 90 gg_wgrad -- m/main/bench_grouped_gemm --no-wmma --shape 8x7B --ops wgrad --runs 12
for r in 1 2 3 4; do
  trainer 330 def_$r 8x7B-2layer
  trainer 330 grp8_$r 8x7B-2layer MXTRAIN_GG_WGRAD_GROUP=8
  trainer 330 lockoff_$r 8x7B-2layer MXTRAIN_GG_WGRAD_LOCKSTEP=off
  trainer 330 both_$r 8x7B-2layer MXTRAIN_GG_WGRAD_GROUP=8 MXTRAIN_GG_WGRAD_LOCKSTEP=off
done
trainer 420 hf_def 8x7B-2layer --hf
trainer 500 hf_both 8x7B-2layer --hf MXTRAIN_GG_WGRAD_GROUP=8 MXTRAIN_GG_WGRAD_LOCKSTEP=off
call_end
grep -h "remainders\]" $W/tests_rem.txt
grep -h "rotating" $W/gg_wgrad.txt | sed 's/ \+/ /g' | cut -c1-170
for f in $W/tr_*.txt; do echo "$(basename $f .txt) $(head -1 $f | cut -c1-150)"; done
