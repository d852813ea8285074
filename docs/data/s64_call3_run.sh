#!/usr/bin/env bash
# Session 64, call 3 (H200, needs_h200), for the last device seconds after call 1 failed to start nine times:
# s64-head 2406cec (main's code since). The 8x7B 2-layer step beside HF with and without the LM head's bf16
# gradient, one alternating round of ours if time is left, then the single wgrad call storing bf16 beside cuBLASLt
# (a step with a timeout, so it ends by CALL_END).
set -u
BIN=m/wip
CALL_END=${CALL_END:-200}
source scripts/device_call_lib.sh
call_begin s64c3
step 15 tests_bf16 -- m/wip/mxtrain_tests --gtest_filter='CudaExpertWgradGroup.Bf16*:CudaLmHeadGradBf16.*'
H=(--set lm_head_grad_dtype=bfloat16)
trainer 60 hf_def 8x7B-2layer --hf
trainer 125 hf_head 8x7B-2layer --hf "${H[@]}"
trainer 150 head_1 8x7B-2layer "${H[@]}"
trainer 160 def_1 8x7B-2layer
step 60 gg_wgrad -- m/wip/bench_grouped_gemm --no-wmma --shape 8x7B --ops wgrad --runs 8
call_end
grep -h 'rotating' "$W/gg_wgrad.txt" | grep -v '^|' | sed 's/ \+/ /g' | cut -c1-150
trainer_summary
