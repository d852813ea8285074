#!/usr/bin/env bash
# Session 59, call 5 (H200, about 300 s of device time left): does lockstep help the single weight-gradient call?
# Lockstep (set_grouped_wgrad_lockstep) is on by default only for calls over several row sets; the single call
# storing bf16 ran W2 at 0.89 of cuBLASLt storing bf16 in calls 1-3. bench_grouped_gemm's wgrad rows, 8x7B, with the
# default and with MXTRAIN_GG_WGRAD_LOCKSTEP=on (every call, the single one included); c3eb28d's build.
set -u
export CALL_END=${CALL_END:-110}
source scripts/device_call_lib.sh
call_begin s59c5
step 45 gg_lock MXTRAIN_GG_WGRAD_LOCKSTEP=on -- m/main/bench_grouped_gemm --no-wmma --shape 8x7B --ops wgrad --runs 12
step 45 gg_def -- m/main/bench_grouped_gemm --no-wmma --shape 8x7B --ops wgrad --runs 12
call_end
for f in $W/gg_lock.txt $W/gg_def.txt; do echo "-- $f"; grep -h "rotating\|alternating with c2\|c2, alternating" $f | sed 's/ \+/ /g' | cut -c1-150; done
