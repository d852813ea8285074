#!/usr/bin/env bash
# Session 58, an H100 call (when the H200 will not start): the kernels and tests of s58_call1_run.sh, and the step at
# a shape that fits 80 GB (8x7B layers, 1 layer instead of 2; the 2-layer step plans 97.5 GiB with bf16 gradients).
# bins.tgz as in s58_call1_run.sh. Most important first:
#  1. the new and touched CUDA tests;  2. the fault bf16swap (must fail the sm90 bf16-store test, and only it);
#  3. bench_grouped_gemm --trainer-call (the trainer's call with an f32 and a bf16 dW), 8x7B;
#  4. the 1-layer 8x7B step: float32 grads / bf16 grads / both, alternating, four rounds (ours only);
#  5. every CUDA test.
set -u
source scripts/device_call_lib.sh
call_begin s58h
step 200 tests_new -- m/main/mxtrain_tests --gtest_filter='CudaExpertWgradGroup.*:CudaBasicOps.AdamW*:CudaMasterRemainders.*'
step 60 tests_fault MXTRAIN_GG_FAULT=bf16swap -- m/main/mxtrain_tests --gtest_filter='CudaExpertWgradGroup.Bf16Store*'
step 90 gg_call -- m/main/bench_grouped_gemm --no-wmma --shape 8x7B --runs 10 --trainer-call
L=(--set config_kwargs.num_hidden_layers=1)
for r in 1 2 3 4; do
  trainer 370 f32_$r 8x7B-2layer "${L[@]}"
  trainer 370 b16_$r 8x7B-2layer "${L[@]}" --set expert_grad_dtype=bfloat16
  trainer 370 b16r_$r 8x7B-2layer "${L[@]}" --set expert_grad_dtype=bfloat16 --set optimizer_store_param_remainders=true
done
ok 420 tests-all && step 578 tests_all -- m/main/mxtrain_tests --gtest_filter='*Cuda*:*Gpu*:*Mxfp8*:-Binary.*'
call_end
trainer_summary
grep -h "trainer's call" $W/gg_call.txt | sed 's/ \+/ /g' | cut -c1-170
