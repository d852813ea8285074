#!/usr/bin/env bash
# Session 58, an H100 call (the H200 would not start): expert_grad_dtype=bfloat16's kernels and tests, and its step
# at a shape that fits 80 GB (8x7B layers, 1 layer instead of 2; the 2-layer step plans 97.5 GiB). bins.tgz as in
# s58_call1_run.sh. Most important first:
#  1. the new and touched CUDA tests;  2. the fault bf16swap (must fail the sm90 bf16-store test, and only it);
#  3. bench_grouped_gemm --trainer-call (the trainer's call with an f32 and a bf16 dW), 8x7B;
#  4. the 1-layer 8x7B step, float32 / bfloat16 alternating, five rounds (ours only);  5. every CUDA test.
set -u
source scripts/device_call_lib.sh
call_begin s58h
step 200 tests_new -- m/main/mxtrain_tests --gtest_filter='CudaExpertWgradGroup.*:CudaBasicOps.AdamW*'
step 60 tests_fault MXTRAIN_GG_FAULT=bf16swap -- m/main/mxtrain_tests --gtest_filter='CudaExpertWgradGroup.Bf16Store*'
step 90 gg_call -- m/main/bench_grouped_gemm --no-wmma --shape 8x7B --runs 10 --trainer-call
for r in 1 2 3 4 5; do
  trainer 360 f32_$r 8x7B-2layer --set config_kwargs.num_hidden_layers=1
  trainer 360 b16_$r 8x7B-2layer --set config_kwargs.num_hidden_layers=1 --set expert_grad_dtype=bfloat16
done
ok 420 tests-all && step 578 tests_all -- m/main/mxtrain_tests --gtest_filter='*Cuda*:*Gpu*:*Mxfp8*:-Binary.*'
call_end
trainer_summary
grep -h "trainer's call" $W/gg_call.txt | sed 's/ \+/ /g' | cut -c1-170
