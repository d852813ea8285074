#!/usr/bin/env bash
# Session 62, call 4 (H200 for the 8x7B 2-layer step; needs_h200), the merge candidate s62-merge (main + the branch's
# one-barrier bf16 epilogue, LM head bf16 gradient option, experts-by-rows option; devbin/bins.tgz, wip/), with
# little device time left (CALL_END 170, two rounds): the bf16 tests, then 8x7B 2 layers in alternating rounds: bars2 (main's
# epilogue, two barriers per box) / def (one) / head (+ lm_head_grad_dtype=bfloat16); HF beside def.
set -u
BIN=m/wip
CALL_END=${CALL_END:-170}
source scripts/device_call_lib.sh
call_begin s62c4
step 30 tests_bf16 -- m/wip/mxtrain_tests --gtest_filter='CudaExpertWgradGroup.Bf16*:CudaLmHeadGradBf16.*'
H=(--set lm_head_grad_dtype=bfloat16)
for r in 1 2; do
  trainer 95 bars2_$r 8x7B-2layer MXTRAIN_GG_WGRAD_EPI_BARS=2
  trainer 95 def_$r 8x7B-2layer
  trainer 95 head_$r 8x7B-2layer "${H[@]}"
done
trainer 112 hf_def 8x7B-2layer --hf
call_end
trainer_summary
