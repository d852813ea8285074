#!/usr/bin/env bash
# Session 73, call 2 (for an H200, needs_h200): main 31035ee, whose bf16 wgrad epilogue writes its boxes by
# stmatrix.x2 by default (call 1 on an H100: W2 +0.5% / +0.6%, 8x7B step +0.3%), measured on the criterion's card.
# Pack: one build of main as `main`:
#   bash scripts/pack_devbin.sh --only mxtrain_tests,bench_grouped_gemm devbin/bins.tgz main=<main build>
#  1. the wgrad, grouped-GEMM and MoE GPU tests;
#  2. the single wgrad call beside cuBLASLt, 12 rotations (c2m = the default, c2m words = before, ...);
#  3. 8x7B 2 layers: stmatrix / words / rows (+ stmatrix) in turn, two rounds, ours only;
#  4. 8x7B beside HF twice (the default), the ratio of the day; 5. the bench again.
set -u
BIN=m/main
CALL_END=${CALL_END:-500}
source scripts/device_call_lib.sh
call_begin s73c2
step 90 tests -- m/main/mxtrain_tests --gtest_filter='CudaExpertWgradGroup.*:CudaGroupedGemm*:CudaMoe*'
step 70 gg_wgrad_1 -- m/main/bench_grouped_gemm --no-wmma --shape 8x7B --ops wgrad --runs 12
big=false
fits_8x7B && big=true
if $big; then
  for r in 1 2; do
    trainer 200 stm_$r 8x7B-2layer
    trainer 200 words_$r 8x7B-2layer MXTRAIN_GG_WGRAD_EPI_STORE=words
    trainer 200 rows_$r 8x7B-2layer MXTRAIN_GG_WGRAD_ORDER=rows
  done
  trainer 330 hf_1 8x7B-2layer --hf
  trainer 400 hf_2 8x7B-2layer --hf
fi
step 70 gg_wgrad_2 -- m/main/bench_grouped_gemm --no-wmma --shape 8x7B --ops wgrad --runs 12
call_end
cat "$W/gpu.txt"
rotating_rows gg_wgrad_1 gg_wgrad_2
trainer_summary
