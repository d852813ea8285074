#!/usr/bin/env bash
# Session 58, call 2 (H200): bench_trainer.py's 8x1B and 8x7B-2layer presets now run with the recipe's gradient and
# master options (expert_grad_dtype=bfloat16, optimizer_store_param_remainders=true). bins.tgz holds main/ = this
# session's build (`bash scripts/pack_devbin.sh --only mxtrain_tests,bench_grouped_gemm devbin/bins.tgz main=build`).
#  1. the new CUDA tests (the split-master training test now also with fixed routing);
#  2. the 8x7B step: the old settings (float32 gradients, whole masters) / the new defaults, three rounds;
#  3. issue 4's figures beside HF: 8x7B 2 layers, then 8x1B;  4. every CUDA test.
set -u
source scripts/device_call_lib.sh
call_begin s58c2
step 120 tests_new -- m/main/mxtrain_tests --gtest_filter='CudaExpertWgradGroup.Bf16*:CudaBasicOps.AdamW*:CudaMasterRemainders.*'
OLD=(--set expert_grad_dtype=float32 --set optimizer_store_param_remainders=false)
for r in 1 2 3; do
  trainer 300 old_$r 8x7B-2layer "${OLD[@]}"
  trainer 300 new_$r 8x7B-2layer
done
trainer 330 hf_8x7B 8x7B-2layer --hf
trainer 420 hf_8x1B 8x1B --hf
ok 470 tests-all && step 578 tests_all -- m/main/mxtrain_tests --gtest_filter='*Cuda*:*Gpu*:*Mxfp8*:-Binary.*'
call_end
grep -h "remainders\]" $W/tests_new.txt
for f in $W/tr_*.txt; do echo "$(basename $f .txt) $(head -1 $f | cut -c1-200)"; done
