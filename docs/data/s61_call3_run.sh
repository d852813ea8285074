#!/usr/bin/env bash
# Session 61, a short H200 call (needs_h200) for the build 441a140 (devbin/bins.tgz, wip/): the bf16 epilogue's and
# the LM head's bf16 GPU tests; the card for the single wgrad call storing bf16 (the rotation with cuBLASLt storing bf16, the new epilogue
# the default), then the 8x7B 2-layer step, two alternating rounds of the preset / + lm_head_grad_dtype=bfloat16,
# and HF beside the latter. CALL_END 330 by default: the session's device time left is short.
set -u
BIN=m/wip
CALL_END=${CALL_END:-330}
source scripts/device_call_lib.sh
call_begin s61c3
step 60 tests_bf16 -- m/wip/mxtrain_tests --gtest_filter='CudaExpertWgradGroup.Bf16*:CudaExpertWgradGroup.Norm*:CudaExpertWgradGroup.ExpertOrder*:CudaLmHeadGradBf16.*'
step 90 gg_wgrad -- m/wip/bench_grouped_gemm --no-wmma --shape 8x7B --ops wgrad --runs 12
H=(--set lm_head_grad_dtype=bfloat16)
for r in 1 2; do
  trainer 200 def_$r 8x7B-2layer
  trainer 200 head_$r 8x7B-2layer "${H[@]}"
done
trainer 250 hf_head 8x7B-2layer --hf "${H[@]}"
call_end
grep -h 'rotating' "$W/gg_wgrad.txt" | grep -v '^|' | sed 's/ \+/ /g' | cut -c1-150
trainer_summary
