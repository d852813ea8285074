#!/usr/bin/env bash
# Prepared in session 60 (no device time left; session 59's script, renamed; session 61: no device lent, the expert
# order's test added), for the next H200 call (needs_h200:
# the 8x7B 2-layer step plans 102.8 GiB), on branch wip/s59-head-bf16: lm_head_grad_dtype=bfloat16, the LM head's
# gradient stored in bf16 by its one held-group GEMM (about 3 GB less per 8x7B step: its fp32 store and the norm's
# and AdamW's reads). bins.tgz: wip/ = the branch's build
#   bash scripts/pack_devbin.sh --only mxtrain_tests,bench_grouped_gemm devbin/bins.tgz wip=build
#  1. the new GPU tests (and MXTRAIN_GG_WGRAD_ORDER's), then 8x7B: the preset / + lm_head_grad_dtype=bfloat16, four alternating rounds;
#  2. the 8x7B figure beside HF with it; 3. every CUDA test.
# Then, on the same warm machine, call 2: docs/data/s61_next_call2_run.sh.
set -u
BIN=m/wip
source scripts/device_call_lib.sh
call_begin head_bf16
step 100 tests_head -- m/wip/mxtrain_tests --gtest_filter='CudaLmHeadGradBf16.*:LmHeadWgradGroup.*:CudaExpertWgradGroup.ExpertOrder*'
H=(--set lm_head_grad_dtype=bfloat16)
for r in 1 2 3 4; do
  trainer 330 def_$r 8x7B-2layer
  trainer 330 head_$r 8x7B-2layer "${H[@]}"
done
trainer 400 hf_head 8x7B-2layer --hf "${H[@]}"
ok 450 tests-all && step 578 tests_all -- m/wip/mxtrain_tests --gtest_filter='*Cuda*:*Gpu*:*Mxfp8*:-Binary.*'
call_end
for f in $W/tr_*.txt; do echo "$(basename $f .txt) $(head -1 $f | cut -c1-150)"; done
