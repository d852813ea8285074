#!/usr/bin/env bash
# Session 61, call 2 (H200 for the 8x7B 2-layer step; needs_h200), branch wip/s59-head-bf16 (devbin/bins.tgz, wip/):
#  1. the GPU tests of the grouped GEMM, the expert weight gradient (the experts by rows, the bf16 epilogue with one
#     barrier per box, now the default) and the LM head's bf16 gradient; MXTRAIN_GG_FAULT=bf16swap must fail the
#     bf16 store test;
#  2. bench_grouped_gemm's wgrad rows at 8x7B: the single call storing bf16 in rotation with cuBLASLt storing bf16
#     (c2m, c2m with two barriers per box, c2m experts by rows, c2n, c2m st.global);
#  3. 8x7B 2 layers, three alternating rounds: the preset / + lm_head_grad_dtype=bfloat16; then HF beside it;
#  4. every CUDA test.
set -u
BIN=m/wip
source scripts/device_call_lib.sh
call_begin s61c2
step 120 tests_new -- m/wip/mxtrain_tests --gtest_filter='CudaExpertWgradGroup.*:CudaLmHeadGradBf16.*:LmHeadWgradGroup.*:*CudaGroupedGemmSm90*'
step 60 tests_fault MXTRAIN_GG_FAULT=bf16swap -- m/wip/mxtrain_tests --gtest_filter='CudaExpertWgradGroup.Bf16*'
step 120 gg_wgrad -- m/wip/bench_grouped_gemm --no-wmma --shape 8x7B --ops wgrad --runs 12
H=(--set lm_head_grad_dtype=bfloat16)
for r in 1 2 3; do
  trainer 330 def_$r 8x7B-2layer
  trainer 330 head_$r 8x7B-2layer "${H[@]}"
done
trainer 400 hf_head 8x7B-2layer --hf "${H[@]}"
ok 470 tests-all && step 578 tests_all -- m/wip/mxtrain_tests --gtest_filter='*Cuda*:*Gpu*:*Mxfp8*:-Binary.*'
call_end
grep -h 'rotating' "$W/gg_wgrad.txt" | grep -v '^|' | sed 's/ \+/ /g' | cut -c1-150
grep -h 'FAILED  \]' "$W/tests_fault.txt" | head -8
trainer_summary
