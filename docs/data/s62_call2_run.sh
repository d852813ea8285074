#!/usr/bin/env bash
# Session 62, call 2 (H200 for the 8x7B 2-layer step; needs_h200), branch wip/s59-head-bf16 (devbin/bins.tgz, wip/):
#  1. the GPU tests of the grouped GEMM, the expert weight gradient (the bf16 epilogue per warp, new, against the
#     barrier forms bit for bit) and the LM head's bf16 gradient; MXTRAIN_GG_FAULT=bf16swap must fail the bf16 tests;
#  2. bench_grouped_gemm's wgrad rows at 8x7B, 20 runs, the rotation now shuffled per run: the single call storing
#     bf16 beside cuBLASLt storing bf16 (c2m one barrier, two barriers, per warp, by rows, c2n, st.global);
#  3. 8x7B 2 layers, four alternating rounds: the preset / per-warp epilogue / LM head's bf16 gradient / both;
#     HF beside both;
#  4. every CUDA test; 5. ncu of W2's single call, one barrier and per warp, if time is left.
set -u
BIN=m/wip
CALL_END=${CALL_END:-578}
source scripts/device_call_lib.sh
call_begin s62c2
step 120 tests_new -- m/wip/mxtrain_tests --gtest_filter='CudaExpertWgradGroup.*:CudaLmHeadGradBf16.*:LmHeadWgradGroup.*:*CudaGroupedGemmSm90*'
step 60 tests_fault MXTRAIN_GG_FAULT=bf16swap -- m/wip/mxtrain_tests --gtest_filter='CudaExpertWgradGroup.Bf16*'
step 120 gg_wgrad -- m/wip/bench_grouped_gemm --no-wmma --shape 8x7B --ops wgrad --runs 20
H=(--set lm_head_grad_dtype=bfloat16)
for r in 1 2 3 4; do
  trainer 330 def_$r 8x7B-2layer
  trainer 330 warp_$r 8x7B-2layer MXTRAIN_GG_WGRAD_EPI_BARS=0
  trainer 330 head_$r 8x7B-2layer "${H[@]}"
  trainer 330 both_$r 8x7B-2layer "${H[@]}" MXTRAIN_GG_WGRAD_EPI_BARS=0
done
trainer 380 hf_both 8x7B-2layer --hf "${H[@]}" MXTRAIN_GG_WGRAD_EPI_BARS=0
step 180 tests_all -- m/wip/mxtrain_tests --gtest_filter='*Cuda*:*Gpu*:*Mxfp8*:-Binary.*'
call_end
grep -h 'rotating' "$W/gg_wgrad.txt" | grep -v '^|' | sed 's/ \+/ /g' | cut -c1-150
grep -h 'FAILED  \]' "$W/tests_fault.txt" "$W/tests_all.txt" "$W/tests_new.txt" | head -12
trainer_summary
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for label in W2_c2m:wgrad_W2_bf16_c2m W2_c2m_warp:wgrad_W2_bf16_c2m_warp W2_dense:wgrad_W2_bf16_dense; do
  ok 500 "ncu $label" || break
  l=${label%%:*} range=${label#*:}
  CUDA_VISIBLE_DEVICES=0 timeout 60 "$NCU" --clock-control none --set full --import-source no --nvtx \
    --nvtx-include "$range/" -c 1 --export "$OUT/ncu_$l" -f m/wip/bench_grouped_gemm --no-wmma --shape 8x7B \
    --ops wgrad --runs 1 </dev/null >"$OUT/ncu_$l.log" 2>&1
  "$NCU" --import "$OUT/ncu_$l.ncu-rep" --page raw --csv </dev/null >"$OUT/ncu_${l}_raw.csv"
  rm -f "$OUT/ncu_$l.ncu-rep"
done
python3 scripts/ncu_table.py W2_c2m="$OUT/ncu_W2_c2m_raw.csv" W2_c2m_warp="$OUT/ncu_W2_c2m_warp_raw.csv" W2_dense="$OUT/ncu_W2_dense_raw.csv" 2>&1 | tail -5
