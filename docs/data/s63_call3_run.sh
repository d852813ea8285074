#!/usr/bin/env bash
# Session 63, call 3 (H200, needs_h200; call 1's script, s63_call1_run.sh, never started: the H200 failed six times),
# trimmed to the device time left: main 0b1dac6 (devbin/bins.tgz, wip/).
#  1. the bf16 GPU tests;  2. the single wgrad call storing bf16 beside cuBLASLt on the H200 (12 runs, shuffled);
#  3. 8x7B 2 layers beside HF (def), then three alternating rounds head (+ lm_head_grad_dtype=bfloat16) / def, then
#     head beside HF. Two barriers per box is left out: on the H100 (call 2) it ran as fast as one in the step.
set -u
BIN=m/wip
CALL_END=${CALL_END:-290}
source scripts/device_call_lib.sh
call_begin s63c3
step 20 tests_bf16 -- m/wip/mxtrain_tests --gtest_filter='CudaExpertWgradGroup.Bf16*:CudaLmHeadGradBf16.*'
step 60 gg_wgrad -- m/wip/bench_grouped_gemm --no-wmma --shape 8x7B --ops wgrad --runs 12
H=(--set lm_head_grad_dtype=bfloat16)
trainer 160 hf_def 8x7B-2layer --hf
for r in 1 2 3; do
  trainer 200 head_$r 8x7B-2layer "${H[@]}"
  trainer 200 def_$r 8x7B-2layer
done
trainer 220 hf_head 8x7B-2layer --hf "${H[@]}"
call_end
grep -h 'rotating' "$W/gg_wgrad.txt" | grep -v '^|' | sed 's/ \+/ /g' | cut -c1-150
trainer_summary
