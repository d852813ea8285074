#!/usr/bin/env bash
# Session 64, call 4 (H100): the review refactor of the bf16 LM-head gradient (size and check once in the
# constructor; the step reads dense_.grad whole). GPU tests and one 8x7B run with the option: same bits as call 2?
set -u
BIN=m/wip
CALL_END=90
source scripts/device_call_lib.sh
call_begin s64c4
step 40 tests_bf16 -- m/wip/mxtrain_tests --gtest_filter='CudaLmHeadGradBf16.*:CudaExpertWgradGroup.Bf16*'
trainer 75 head_1 8x7B-2layer --set lm_head_grad_dtype=bfloat16
call_end
trainer_summary
tail -1 "$W"/tr_head_1/bench_8x7B_2layer/metrics.jsonl | cut -c1-120
grep -h "device memory: peak" "$W"/tr_head_1/*.log | head -1
