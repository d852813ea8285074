#!/usr/bin/env bash
# Session 61, call 2 on an H100 (the H200 locked out for 10 minutes), branch wip/s59-head-bf16 at 441a140
# (devbin/bins.tgz, wip/): the new bf16 epilogue (one barrier per box, the default) and the rest of the branch:
#  1. the grouped-GEMM, expert-wgrad and LM-head bf16 GPU tests; MXTRAIN_GG_FAULT=bf16swap must fail the bf16 store test;
#  2. bench_grouped_gemm's wgrad rows at 8x7B (the bf16 single call's variants in rotation with cuBLASLt storing bf16);
#  3. every CUDA test;
#  4. ncu of W2's single call: the new epilogue and the two-barrier form (cycles, tensor pipe, stalls by SASS).
set -u
BIN=m/wip
CALL_END=${CALL_END:-330}
source scripts/device_call_lib.sh
call_begin s61c2h
step 120 tests_new -- m/wip/mxtrain_tests --gtest_filter='CudaExpertWgradGroup.*:CudaLmHeadGradBf16.*:LmHeadWgradGroup.*:*CudaGroupedGemmSm90*'
step 60 tests_fault MXTRAIN_GG_FAULT=bf16swap -- m/wip/mxtrain_tests --gtest_filter='CudaExpertWgradGroup.Bf16*'
step 120 gg_wgrad -- m/wip/bench_grouped_gemm --no-wmma --shape 8x7B --ops wgrad --runs 12
step 200 tests_all -- m/wip/mxtrain_tests --gtest_filter='*Cuda*:*Gpu*:*Mxfp8*:-Binary.*'
call_end
grep -h 'rotating' "$W/gg_wgrad.txt" | grep -v '^|' | sed 's/ \+/ /g' | cut -c1-150
grep -h 'FAILED  \]' "$W/tests_fault.txt" "$W/tests_all.txt" | head -12
[ "${NCU_RUNS:-1}" = 0 ] && exit 0  # a short call: no ncu
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for label in W2_c2m:wgrad_W2_bf16_c2m W2_c2m_bars2:wgrad_W2_bf16_c2m_bars2; do
  l=${label%%:*} range=${label#*:}
  CUDA_VISIBLE_DEVICES=0 timeout 100 "$NCU" --clock-control none --set full --import-source no --nvtx \
    --nvtx-include "$range/" -c 1 --export "$OUT/ncu_$l" -f m/wip/bench_grouped_gemm --no-wmma --shape 8x7B \
    --ops wgrad --runs 1 </dev/null >"$OUT/ncu_$l.log" 2>&1
  "$NCU" --import "$OUT/ncu_$l.ncu-rep" --page raw --csv </dev/null >"$OUT/ncu_${l}_raw.csv"
  "$NCU" --import "$OUT/ncu_$l.ncu-rep" --page source --csv --print-source sass </dev/null | gzip >"$OUT/ncu_${l}_sass.csv.gz"
  rm -f "$OUT/ncu_$l.ncu-rep"
done
python3 scripts/ncu_table.py W2_c2m="$OUT/ncu_W2_c2m_raw.csv" W2_c2m_bars2="$OUT/ncu_W2_c2m_bars2_raw.csv"
