#!/usr/bin/env bash
# Session 63, call 2 on an H100 (the H200 failed to start four times): main 0b1dac6 (devbin/bins.tgz, wip/). Does the
# 8x7B 2-layer step (peak 76.4 GiB on the H200) fit the H100? If so, three alternating rounds bars2 (two barriers per
# box) / def (one) / head (+ lm_head_grad_dtype=bfloat16), then HF beside def and beside head. An H100 ratio, not
# the H200 one.
set -u
BIN=m/wip
CALL_END=${CALL_END:-330}
source scripts/device_call_lib.sh
call_begin s63c2h
nvidia-smi --query-gpu=memory.total,memory.free --format=csv >> "$W/gpu.txt" 2>&1
step 40 tests_bf16 -- m/wip/mxtrain_tests --gtest_filter='CudaExpertWgradGroup.Bf16*:CudaLmHeadGradBf16.*'
H=(--set lm_head_grad_dtype=bfloat16)
trainer 100 def_1 8x7B-2layer
if grep -q '^| 8x7B' "$W/tr_def_1.txt"; then
  trainer 200 bars2_1 8x7B-2layer MXTRAIN_GG_WGRAD_EPI_BARS=2
  trainer 200 head_1 8x7B-2layer "${H[@]}"
  for r in 2 3; do
    trainer 200 bars2_$r 8x7B-2layer MXTRAIN_GG_WGRAD_EPI_BARS=2
    trainer 200 def_$r 8x7B-2layer
    trainer 200 head_$r 8x7B-2layer "${H[@]}"
  done
  trainer 245 hf_def 8x7B-2layer --hf
  trainer 262 hf_head 8x7B-2layer --hf "${H[@]}"
else
  tail -5 "$W/tr_def_1.txt"; grep -h "error\|memory" "$W"/tr_def_1/*.log 2>/dev/null | tail -5
fi
call_end
trainer_summary
