#!/usr/bin/env bash
# Session 67, call 1 (H100 or H200): branch s67-defer (main 764bc3c + the wgrad's bf16 boxes stored one per k-block
# under the next item's first k-blocks, MXTRAIN_GG_WGRAD_EPI_DEFER=1). devbin/br.tgz: the branch (91295df: the
# first k-blocks unrolled, all 8 boxes deferred; ptxas puts the deferred words in local memory, 608-616 bytes);
# devbin/x.tgz: bench_grouped_gemm of main (764bc3c), of the branch's first form (6ca1e26, the box picked at run
# time: bench_gg_sel8) and of the branch with 4 of the 8 boxes deferred (MXTRAIN_GG_DEFER_BOXES=4: bench_gg_peel4).
#  1. the expert-wgrad GPU tests (the deferred form bit for bit against two barriers);
#  2. the single wgrad call storing bf16 beside cuBLASLt: branch / main / sel8 / peel4 / branch;
#  3. 8x7B 2 layers, ours only, alternating defer off / on, two rounds; then every CUDA test if time is left.
set -u
BIN=m/br
CALL_END=${CALL_END:-400}
source scripts/device_call_lib.sh
call_begin s67c1
mkdir -p m && tar xzf devbin/br.tgz -C m && tar xzf devbin/x.tgz -C m
step 90 tests_wg -- m/br/mxtrain_tests --gtest_filter='CudaExpertWgradGroup.*'
G=(--no-wmma --shape 8x7B --ops wgrad --runs 12)
step 60 gg_br1 -- m/br/bench_grouped_gemm "${G[@]}"
step 60 gg_main -- m/x/bench_gg_main "${G[@]}"
step 60 gg_sel8 -- m/x/bench_gg_sel8 "${G[@]}"
step 60 gg_peel4 -- m/x/bench_gg_peel4 "${G[@]}"
step 60 gg_br2 -- m/br/bench_grouped_gemm "${G[@]}"
for r in 1 2; do
  trainer 330 off_$r 8x7B-2layer
  trainer 330 on_$r 8x7B-2layer MXTRAIN_GG_WGRAD_EPI_DEFER=1
done
step 200 tests_all -- m/br/mxtrain_tests --gtest_filter='Cuda*'
call_end
for f in "$W"/gg_*.txt; do
  echo "-- $(basename "$f")"
  grep 'rotating' "$f" | grep -v '^|' | sed 's/ \+/ /g' | cut -c1-110
done
trainer_summary
