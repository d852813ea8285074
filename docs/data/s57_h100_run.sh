#!/usr/bin/env bash
# Session 57's fallback for an H100 (78 GiB: the 8x7B-2layer and 8x1B trainer runs plan 103 / 128 GiB and do not
# fit): the kernel half of docs/data/s55_call1_run.sh, on the same binaries (branch wip/s55-half-tail). Most
# important first: the grouped GEMM's CUDA tests and the fault halfsum (must fail HalfUnitsAddUp); bench_grouped_gemm
# forward / dgrad at one 8x7B micro-batch's rows and at the 16,384-row 8x7B shape, off / on / last alternating, three
# rounds; every CUDA test with half units last. (Its closing summary, run inline then, is now the library's gg_summary.)
source scripts/device_call_lib.sh
call_begin s57h100
step 150 tests_gg -- m/main/mxtrain_tests --gtest_filter='*GroupedGemm*:GroupedSchedule.*:CudaExpertWgradGroup.*:CudaMoe*'
step 60 tests_fault_must_fail MXTRAIN_GG_FAULT=halfsum -- m/main/mxtrain_tests --gtest_filter='*HalfUnitsAddUp*'
for r in 1 2 3; do
  for s in 8x7B-mb1 8x7B; do
    for h in off on last; do
      ok 400 "gg $s $h$r" && step 40 gg_${s}_$h$r MXTRAIN_GG_HALF_TAIL=$h -- m/main/bench_grouped_gemm --no-wmma \
        --shape $s --runs 10 --ops fwd,dgrad
    done
  done
done
ok 420 tests-all && step 150 tests_all MXTRAIN_GG_HALF_TAIL=last -- m/main/mxtrain_tests \
  --gtest_filter='*Cuda*:*Gpu*:*Mxfp8*:-Binary.*'
call_end
gg_summary
