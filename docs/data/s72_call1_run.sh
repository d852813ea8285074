#!/usr/bin/env bash
# Session 72, call 1 (449 s of device time left): the experts-by-rows wgrad default beside main, benches first.
# Same pack as s70_call1_run.sh (wip = main's build, rows = branch wip/rows-default d42ea9f); main and rows
# interleave so that drift in the card's clocks falls on both.
set -u
BIN=m/wip
CALL_END=${CALL_END:-230}
source scripts/device_call_lib.sh
call_begin s72c1
step 40 gg_wgrad_a -- m/wip/bench_grouped_gemm --no-wmma --shape 8x7B --ops wgrad --runs 12
step 40 gg_wgrad_rows_a -- m/rows/bench_grouped_gemm --no-wmma --shape 8x7B --ops wgrad --runs 12
step 60 tests_rows -- m/rows/mxtrain_tests --gtest_filter='CudaExpertWgradGroup.*:CudaGroupedGemm*:CudaMoe*'
step 40 gg_wgrad_b -- m/wip/bench_grouped_gemm --no-wmma --shape 8x7B --ops wgrad --runs 12
step 40 gg_wgrad_rows_b -- m/rows/bench_grouped_gemm --no-wmma --shape 8x7B --ops wgrad --runs 12
call_end
cat "$W/gpu.txt"
for f in gg_wgrad_a gg_wgrad_rows_a gg_wgrad_b gg_wgrad_rows_b; do
  echo "== $f"; grep -h 'rotating' "$W/$f.txt" | grep -v '^|' | sed 's/ \+/ /g' | cut -c1-110
done
