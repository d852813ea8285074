#!/usr/bin/env bash
# Session 72, call 2 (prepared for the next H200, needs_h200, or an H100; not run in session 72; it supersedes
# s70_call1_run.sh and s72_call1_run.sh, which never ran and are removed): the bf16 wgrad epilogue's
# boxes written by stmatrix.x2, and the experts-by-rows order, each against main's defaults.
# Pack: one build, branch wip/s72-stmatrix (dafb247 = main 49bca16 plus the stmatrix form as an option; also
# main since session 73), as `stm` (26 MB):
#   bash scripts/pack_devbin.sh --only mxtrain_tests,bench_grouped_gemm devbin/bins.tgz stm=<branch build>
# Its defaults are main's (index order, per-word stores); the variables pick the others.
#  1. the branch's wgrad, grouped-GEMM and MoE GPU tests (Bf16EpilogueFormsChangeNoBit: stmatrix = words, bit
#     for bit);
#  2. the single wgrad call beside cuBLASLt, 12 rotations (rows: c2m, experts by rows, stmatrix, both, ...);
#  3. 8x7B 2 layers, ours only: index / rows / stmatrix / rows + stmatrix in turn, three rounds;
#  4. the bench again, 12 rotations; 5. 8x7B beside HF once (main's defaults) for the ratio of the day.
# The 8x7B step plans 75.4 GiB (measured peak 75.40, session 64), so it runs on an H100's 80 GB too (an H100's
# figures are not the criterion's card); only a card under 80,000 MiB skips it.
set -u
BIN=m/stm
CALL_END=${CALL_END:-430}
source scripts/device_call_lib.sh
call_begin s72c2
step 90 tests_stm -- m/stm/mxtrain_tests --gtest_filter='CudaExpertWgradGroup.*:CudaGroupedGemm*:CudaMoe*'
step 70 gg_wgrad_1 -- m/stm/bench_grouped_gemm --no-wmma --shape 8x7B --ops wgrad --runs 12
big=false
fits_8x7B && big=true
if $big; then
  for r in 1 2 3; do
    trainer 260 index_$r 8x7B-2layer MXTRAIN_GG_WGRAD_ORDER=index MXTRAIN_GG_WGRAD_EPI_STORE=words
    trainer 260 rows_$r 8x7B-2layer MXTRAIN_GG_WGRAD_ORDER=rows MXTRAIN_GG_WGRAD_EPI_STORE=words
    trainer 260 stm_$r 8x7B-2layer MXTRAIN_GG_WGRAD_ORDER=index MXTRAIN_GG_WGRAD_EPI_STORE=stmatrix
    trainer 260 rowstm_$r 8x7B-2layer MXTRAIN_GG_WGRAD_ORDER=rows MXTRAIN_GG_WGRAD_EPI_STORE=stmatrix
  done
fi
step 70 gg_wgrad_2 -- m/stm/bench_grouped_gemm --no-wmma --shape 8x7B --ops wgrad --runs 12
$big && trainer 330 hf_1 8x7B-2layer --hf
call_end
cat "$W/gpu.txt"
rotating_rows gg_wgrad_1 gg_wgrad_2
trainer_summary
