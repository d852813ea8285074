#!/usr/bin/env bash
# Session 62, call 2 on an H100 (the H200 locked out): s62_call2_run.sh without the 8x7B trainer runs (they need
# the H200's memory): the GPU tests, the fault run, the wgrad bench (20 runs, shuffled), every CUDA test, ncu of W2.
set -u
BIN=m/wip
CALL_END=${CALL_END:-578}
source scripts/device_call_lib.sh
call_begin s62c2h
step 120 tests_new -- m/wip/mxtrain_tests --gtest_filter='CudaExpertWgradGroup.*:CudaLmHeadGradBf16.*:LmHeadWgradGroup.*:*CudaGroupedGemmSm90*'
step 60 tests_fault MXTRAIN_GG_FAULT=bf16swap -- m/wip/mxtrain_tests --gtest_filter='CudaExpertWgradGroup.Bf16*'
step 120 gg_wgrad -- m/wip/bench_grouped_gemm --no-wmma --shape 8x7B --ops wgrad --runs 20
step 180 tests_all -- m/wip/mxtrain_tests --gtest_filter='*Cuda*:*Gpu*:*Mxfp8*:-Binary.*'
call_end
grep -h 'rotating' "$W/gg_wgrad.txt" | grep -v '^|' | sed 's/ \+/ /g' | cut -c1-150
grep -h 'FAILED  \]' "$W/tests_fault.txt" "$W/tests_all.txt" "$W/tests_new.txt" | head -12
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
