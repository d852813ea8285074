#!/usr/bin/env bash
# Session 70, call 1 (H200, needs_h200): is the experts-by-rows wgrad order worth making the default?
# Two builds packed: wip = main aeaf5f0 (index order by default), rows = branch wip/rows-default (d42ea9f, the
# same code with rows as the default).
#  1. the rows build's grouped-GEMM and expert-MLP GPU tests;
#  2. the single wgrad call beside cuBLASLt, main's build, 24 runs (its rotation holds the by-rows variant);
#  3. the same, the rows build, 12 runs (its default row is the rows order);
#  4. 8x7B 2 layers, ours only, index order / rows order (MXTRAIN_GG_WGRAD_ORDER) alternating, three rounds.
set -u
BIN=m/wip
CALL_END=${CALL_END:-300}
source scripts/device_call_lib.sh
call_begin s70c1
step 90 tests_rows -- m/rows/mxtrain_tests --gtest_filter='CudaExpertWgradGroup.*:CudaGroupedGemm*:CudaMoe*'
step 110 gg_wgrad -- m/wip/bench_grouped_gemm --no-wmma --shape 8x7B --ops wgrad --runs 24
step 70 gg_wgrad_rows -- m/rows/bench_grouped_gemm --no-wmma --shape 8x7B --ops wgrad --runs 12
# The 8x7B step plans 75.4 GiB (measured peak 75.40, session 64): it fits an H100's 80 GB (81,559 MiB), so
# only a card under 80,000 MiB skips it. (Session 71 gated at 120,000 MiB on session 61's 102.8 GiB plan: stale.)
mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
if [ "${mib:-0}" -ge 80000 ]; then
  for r in 1 2 3; do
    trainer 290 index_$r 8x7B-2layer MXTRAIN_GG_WGRAD_ORDER=index
    trainer 290 rows_$r 8x7B-2layer MXTRAIN_GG_WGRAD_ORDER=rows
  done
else
  t "trainer runs skipped: ${mib:-no} MiB on this card, the step plans 75.4 GiB"
fi
call_end
cat "$W/gpu.txt"
for f in gg_wgrad gg_wgrad_rows; do echo "== $f"; grep -h 'rotating' "$W/$f.txt" | grep -v '^|' | sed 's/ \+/ /g' | cut -c1-110; done
trainer_summary
