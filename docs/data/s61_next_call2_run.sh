#!/usr/bin/env bash
# Prepared in sessions 60-61 (no device time), for the call after s61_next_call1_run.sh on the same warm H200 (same
# bins.tgz, wip/ = branch wip/s59-head-bf16's build):
#  1. bench_grouped_gemm's wgrad rows at 8x7B: the single call storing bf16, in rotation with cuBLASLt storing bf16,
#     now also with the schedule's experts by decreasing rows (MXTRAIN_GG_WGRAD_ORDER=rows; session 60's schedule
#     model: W2's busiest CTA pair 1.0079 -> 1.0054 of the mean, about +0.25%; W2 was 0.89 of cuBLASLt, goal 0.9);
#  2. what limits the single-call W2 weight gradient: ncu --set full on W13 and W2, ours (pairs over m; W2 also with
#     the experts by rows) with and without its epilogue, beside cuBLASLt's dense GEMM storing bf16, each launch
#     picked by its NVTX range (device_dist_checks.sh wgncu16; if --nvtx-include picks nothing, the logs say "No
#     kernels were profiled" and the table script stops).
set -u
BIN=m/wip
source scripts/device_call_lib.sh
call_begin wgorder
step 120 gg_wgrad -- m/wip/bench_grouped_gemm --no-wmma --shape 8x7B --ops wgrad --runs 12
call_end
grep -h 'rotating' "$W/gg_wgrad.txt" | sed 's/ \+/ /g' | cut -c1-170
bash scripts/device_dist_checks.sh m/wip wgncu16
ls -la "$OUT" | head -30
