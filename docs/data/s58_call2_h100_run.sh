#!/usr/bin/env bash
# Session 58, call 2 on an H100 (the H200 would not start): the final build's new CUDA tests (the split-master
# training test now also with fixed routing), every CUDA test, and the 1-layer 8x7B step old / new settings.
set -u
source scripts/device_call_lib.sh
call_begin s58c2h
step 120 tests_new -- m/main/mxtrain_tests --gtest_filter='CudaExpertWgradGroup.Bf16*:CudaBasicOps.AdamW*:CudaMasterRemainders.*'
OLD=(--set expert_grad_dtype=float32 --set optimizer_store_param_remainders=false)
L=(--set config_kwargs.num_hidden_layers=1)
for r in 1 2 3; do
  trainer 200 old_$r 8x7B-2layer "${L[@]}" "${OLD[@]}"
  trainer 200 new_$r 8x7B-2layer "${L[@]}"
done
ok 260 tests-all && step 578 tests_all -- m/main/mxtrain_tests --gtest_filter='*Cuda*:*Gpu*:*Mxfp8*:-Binary.*'
call_end
grep -h "remainders\]" $W/tests_new.txt
for f in $W/tr_*.txt; do echo "$(basename $f .txt) $(head -1 $f | cut -c1-200)"; done
