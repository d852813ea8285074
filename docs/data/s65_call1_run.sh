#!/usr/bin/env bash
# Session 65, call 1 (H200, needs_h200): main 4a2ea54 (the LM head bf16 gradient without the fp32 slice; session 64
# measured it only on an H100). Session 64 call 1, which never started:
#  1. the bf16 GPU tests;  2. the single wgrad call storing bf16 beside cuBLASLt (12 runs, shuffled);
#  3. 8x7B 2 layers: HF beside def and beside head (+ lm_head_grad_dtype=bfloat16) twice each, with three
#     alternating ours-only rounds head / def between them.
set -u
BIN=m/wip
CALL_END=${CALL_END:-470}
source scripts/device_call_lib.sh
call_begin s65c1
step 20 tests_bf16 -- m/wip/mxtrain_tests --gtest_filter='CudaExpertWgradGroup.Bf16*:CudaLmHead*'
step 60 gg_wgrad -- m/wip/bench_grouped_gemm --no-wmma --shape 8x7B --ops wgrad --runs 12
H=(--set lm_head_grad_dtype=bfloat16)
trainer 200 hf_def_1 8x7B-2layer --hf
trainer 260 hf_head_1 8x7B-2layer --hf "${H[@]}"
for r in 1 2 3; do
  trainer 380 head_$r 8x7B-2layer "${H[@]}"
  trainer 380 def_$r 8x7B-2layer
done
trainer 400 hf_def_2 8x7B-2layer --hf
trainer 400 hf_head_2 8x7B-2layer --hf "${H[@]}"
call_end
grep -h 'rotating' "$W/gg_wgrad.txt" | grep -v '^|' | sed 's/ \+/ /g' | cut -c1-150
trainer_summary
