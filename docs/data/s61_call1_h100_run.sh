#!/usr/bin/env bash
# Session 61, call 1 on an H100 (the H200 did not start), branch wip/s59-head-bf16 at 908d399 (devbin/bins.tgz,
# wip/): the new GPU tests (the wgrad experts by rows, the LM head's bf16 gradient) with the expert-wgrad and
# grouped-GEMM suites; bench_grouped_gemm's wgrad rows at 8x7B (the single call storing bf16 in a five-way rotation
# with cuBLASLt storing bf16: c2m, c2n, c2m experts by rows, c2m st.global); then ncu (device_dist_checks.sh wgncu16)
# as far as the call's time goes.
set -u
BIN=m/wip
CALL_END=${CALL_END:-300}
source scripts/device_call_lib.sh
call_begin s61c1
step 150 tests_new -- m/wip/mxtrain_tests --gtest_filter='CudaExpertWgradGroup.*:CudaLmHeadGradBf16.*:LmHeadWgradGroup.*:*CudaGroupedGemmSm90*'
step 150 gg_wgrad -- m/wip/bench_grouped_gemm --no-wmma --shape 8x7B --ops wgrad --runs 12
call_end
grep -h 'rotating' "$W/gg_wgrad.txt" | sed 's/ \+/ /g' | cut -c1-170
grep -h 'FAILED\|Failure' "$W/tests_new.txt" | head -20
bash scripts/device_dist_checks.sh m/wip wgncu16
