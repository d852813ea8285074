#!/usr/bin/env bash
# Session 73, call 3 (H200, needs_h200, for the last ~270 s of device time): main's single wgrad call beside
# cuBLASLt once, 12 rotations (c2m = the stmatrix default, c2m words = before). Pack as for s73_call2_run.sh.
set -u
BIN=m/main
CALL_END=${CALL_END:-120}
source scripts/device_call_lib.sh
call_begin s73c3
step 80 gg_wgrad_1 -- m/main/bench_grouped_gemm --no-wmma --shape 8x7B --ops wgrad --runs 12
call_end
cat "$W/gpu.txt"
rotating_rows gg_wgrad_1
