#!/usr/bin/env bash
# Session 63, call 1 (H200, needs_h200): main 0b1dac6 (devbin/bins.tgz, wip/). Session 62's call 4, made longer:
#  1. the bf16 GPU tests;  2. the single wgrad call storing bf16 beside cuBLASLt on the H200 (20 runs, shuffled);
#  3. 8x7B 2 layers in four alternating rounds: bars2 (two barriers per box, main before s62) / def (one) / head
#     (+ lm_head_grad_dtype=bfloat16);  4. HF beside def and beside head.
set -u
BIN=m/wip
CALL_END=${CALL_END:-470}
source scripts/device_call_lib.sh
call_begin s63c1
step 40 tests_bf16 -- m/wip/mxtrain_tests --gtest_filter='CudaExpertWgradGroup.Bf16*:CudaLmHeadGradBf16.*'
step 90 gg_wgrad -- m/wip/bench_grouped_gemm --no-wmma --shape 8x7B --ops wgrad --runs 20
H=(--set lm_head_grad_dtype=bfloat16)
for r in 1 2 3 4; do
  trainer 330 bars2_$r 8x7B-2layer MXTRAIN_GG_WGRAD_EPI_BARS=2
  trainer 330 def_$r 8x7B-2layer
  trainer 330 head_$r 8x7B-2layer "${H[@]}"
done
trainer 375 hf_def 8x7B-2layer --hf
trainer 400 hf_head 8x7B-2layer --hf "${H[@]}"
call_end
grep -h 'rotating' "$W/gg_wgrad.txt" | grep -v '^|' | sed 's/ \+/ /g' | cut -c1-150
trainer_summary
