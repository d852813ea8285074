#!/usr/bin/env bash
# Session 58, call 1 (H200): expert_grad_dtype=bfloat16 (the expert weight gradients stored in bf16 by the step's
# one storing GEMM, read by AdamW in bf16) and optimizer_store_param_remainders=true (the fp32 master held as the
# bf16 working copy + a 16-bit remainder). bins.tgz holds main/ = this session's build (`bash scripts/pack_devbin.sh
# --only mxtrain_tests,bench_grouped_gemm devbin/bins.tgz main=build`). Most important first:
#  1. the new and touched CUDA tests (bf16 store, its fallback, AdamW on bf16 grads, split masters, training runs);
#  2. the fault bf16swap (must fail the sm90 bf16-store test, and only it);
#  3. the 8x7B step: float32 grads / bf16 grads / bf16 grads + remainders, alternating, four rounds (ours only);
#  4. bench_grouped_gemm --trainer-call (the trainer's call with an f32 and a bf16 dW);
#  5. issue 4's 8x7B figure: bf16 grads + remainders beside HF; its step by op (MXTRAIN_STAGE_TIMING=ops);
#  6. 8x1B float32 / both;  7. every CUDA test.
set -u
source scripts/device_call_lib.sh
call_begin s58c1
step 200 tests_new -- m/main/mxtrain_tests --gtest_filter='CudaExpertWgradGroup.*:CudaBasicOps.AdamW*:CudaMasterRemainders.*'
step 60 tests_fault MXTRAIN_GG_FAULT=bf16swap -- m/main/mxtrain_tests --gtest_filter='CudaExpertWgradGroup.Bf16Store*'
B=(--set expert_grad_dtype=bfloat16)
R=(--set expert_grad_dtype=bfloat16 --set optimizer_store_param_remainders=true)
for r in 1 2 3 4; do
  trainer 330 f32_$r 8x7B-2layer
  trainer 330 b16_$r 8x7B-2layer "${B[@]}"
  trainer 330 b16r_$r 8x7B-2layer "${R[@]}"
done
step 90 gg_call -- m/main/bench_grouped_gemm --no-wmma --shape 8x7B --runs 10 --trainer-call
trainer 400 hf_b16r 8x7B-2layer --hf "${R[@]}"
trainer 420 b16r_ops 8x7B-2layer "${R[@]}" MXTRAIN_STAGE_TIMING=ops
trainer 440 8x1B_f32 8x1B
trainer 450 8x1B_b16r 8x1B "${R[@]}"
ok 450 tests-all && step 578 tests_all -- m/main/mxtrain_tests --gtest_filter='*Cuda*:*Gpu*:*Mxfp8*:-Binary.*'
call_end
trainer_summary
grep -h "trainer's call" $W/gg_call.txt | sed 's/ \+/ /g' | cut -c1-170
