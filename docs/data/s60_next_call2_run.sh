#!/usr/bin/env bash
# Prepared in session 60, for the call after s60_next_call1_run.sh on the same warm H200 (same bins.tgz): what
# limits the single-call W2 weight gradient storing bf16 (0.89 of cuBLASLt storing bf16 in four calls of four,
# session 59; W13 0.90-0.96): ncu --set full on W13 and W2, ours (pairs over m) with and without its epilogue, beside
# cuBLASLt's dense GEMM storing bf16, each launch picked by its NVTX range (device_dist_checks.sh wgncu16; not run
# yet: if --nvtx-include picks nothing, the logs say "No kernels were profiled" and the table script stops).
set -u
mkdir -p m && tar xzf devbin/bins.tgz -C m
bash scripts/device_dist_checks.sh m/wip wgncu16
ls -la "$OUT" | head -30
