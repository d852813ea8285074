#!/usr/bin/env bash
# Session 68, call 1 (H200, needs_h200): main with the 8x7B preset's LM-head gradient in bf16 (bench_trainer.py).
#  1. the bf16 GPU tests;  2. the single wgrad call storing bf16 beside cuBLASLt (12 runs, shuffled);
#  3. 8x7B 2 layers beside HF three times, with ours-only rounds of the preset and of the fp32 head between them.
set -u
BIN=m/wip
CALL_END=${CALL_END:-430}
source scripts/device_call_lib.sh
call_begin s68c1
step 30 tests_bf16 -- m/wip/mxtrain_tests --gtest_filter='CudaExpertWgradGroup.Bf16*:CudaLmHead*'
step 70 gg_wgrad -- m/wip/bench_grouped_gemm --no-wmma --shape 8x7B --ops wgrad --runs 12
F=(--set lm_head_grad_dtype=float32)
trainer 200 hf_1 8x7B-2layer --hf
for r in 1 2; do
  trainer 300 f32_$r 8x7B-2layer "${F[@]}"
  trainer 300 head_$r 8x7B-2layer
done
trainer 330 hf_2 8x7B-2layer --hf
trainer 370 hf_3 8x7B-2layer --hf
call_end
grep -h 'rotating' "$W/gg_wgrad.txt" | grep -v '^|' | sed 's/ \+/ /g' | cut -c1-150
trainer_summary
