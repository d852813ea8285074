#!/usr/bin/env bash
# Session 64, call 2 (H100; the H200 failed to start twice): branch s64-head 2406cec (main d15418c + the LM head's
# bf16 gradient without the unused fp32 slice of the dense gradient). Checks the change (the bf16 GPU tests, then
# the 8x7B 2-layer step's peak memory and speed with and without lm_head_grad_dtype=bfloat16, alternating).
set -u
BIN=m/wip
CALL_END=${CALL_END:-160}
source scripts/device_call_lib.sh
call_begin s64c2
step 40 tests_bf16 -- m/wip/mxtrain_tests --gtest_filter='CudaExpertWgradGroup.Bf16*:CudaLmHead*'
H=(--set lm_head_grad_dtype=bfloat16)
for r in 1 2 3; do
  trainer 130 head_$r 8x7B-2layer "${H[@]}"
  trainer 140 def_$r 8x7B-2layer
done
call_end
trainer_summary
grep -h "device memory: peak" "$W"/tr_*/*.log | sed "s/^.*device memory/device memory/" | sort | uniq -c
