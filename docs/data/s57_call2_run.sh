#!/usr/bin/env bash
# Session 57's call 2 (the warm H100 of call 1, 227 s of device time left), same binaries as docs/data/s57_h100_run.sh
# (branch wip/s55-half-tail): bench_grouped_gemm forward / dgrad, off / last alternating, five rounds at one 8x7B
# micro-batch's rows (8x7B-mb1) and two at the 16,384-row 8x7B shape. Run inline as one command; kept here as a file.
source scripts/device_call_lib.sh
CALL_END=170
call_begin s57x
for r in 1 2 3 4 5; do
  for h in off last; do
    step 20 gg_mb1_${h}$r MXTRAIN_GG_HALF_TAIL=$h -- m/main/bench_grouped_gemm --no-wmma --shape 8x7B-mb1 --runs 10 \
      --ops fwd,dgrad
  done
done
for r in 1 2; do
  for h in off last; do
    step 20 gg_full_${h}$r MXTRAIN_GG_HALF_TAIL=$h -- m/main/bench_grouped_gemm --no-wmma --shape 8x7B --runs 10 \
      --ops fwd,dgrad
  done
done
call_end > /dev/null
echo done
