#!/usr/bin/env bash
# Session 55's call, for the next session lent a GPU (session 55 was lent none): branch wip/s55-half-tail (the
# forward / dgrad grouped GEMM's half units, MXTRAIN_GG_HALF_TAIL=off|on|last; patch docs/data/s55_wip_half_tail.patch,
# `git apply` on main). bins.tgz holds main/ = that branch's build
# (`bash scripts/pack_devbin.sh --only mxtrain_tests,bench_grouped_gemm devbin/bins.tgz main=build`); with the knob off
# its forward / dgrad kernels are main's (same instruction and spill counts per kernel). Each step starts only
# before its deadline (scripts/device_call_lib.sh), so the archive always comes back. Most important first:
#  1. the grouped GEMM's CUDA tests (HalfUnitsAddUp, HalfUnitsChangeOnlyTheirRows among them), and the fault
#     halfsum (must fail HalfUnitsAddUp);
#  2. the 8x7B step, off / on / last in turn, three rounds (ours only);
#  3. bench_grouped_gemm forward / dgrad at one 8x7B micro-batch's rows (8x7B-mb1), off / on / last, two rounds;
#  4. issue 4's 8x7B figure: last beside HF;  5. 8x1B off / last;  6. every CUDA test with half units last.
# docs/data/s55_half_schedule_model.cpp predicts: on, no change (the static schedule's busiest pair keeps its work);
# last, the forward / dgrad 1.4% shorter, about 0.45% of the step, less whatever L2 misses moving them adds.
source scripts/device_call_lib.sh
call_begin s55c1
step 150 tests_gg -- m/main/mxtrain_tests --gtest_filter='*GroupedGemm*:GroupedSchedule.*:CudaExpertWgradGroup.*:CudaMoe*'
step 60 tests_fault_must_fail MXTRAIN_GG_FAULT=halfsum -- m/main/mxtrain_tests --gtest_filter='*HalfUnitsAddUp*'
for r in 1 2 3; do
  for h in off on last; do
    trainer 400 $h$r 8x7B-2layer MXTRAIN_GG_HALF_TAIL=$h
  done
done
for r in 1 2; do
  for h in off on last; do
    ok 450 "gg $h$r" && step 60 gg_$h$r MXTRAIN_GG_HALF_TAIL=$h -- m/main/bench_grouped_gemm --no-wmma --shape 8x7B-mb1 \
      --runs 10 --ops fwd,dgrad
  done
done
trainer 420 hf 8x7B-2layer --hf MXTRAIN_GG_HALF_TAIL=last
trainer 430 8x1B_off 8x1B MXTRAIN_GG_HALF_TAIL=off
trainer 430 8x1B_last 8x1B MXTRAIN_GG_HALF_TAIL=last
ok 440 tests-all && step 140 tests_all MXTRAIN_GG_HALF_TAIL=last -- m/main/mxtrain_tests \
  --gtest_filter='*Cuda*:*Gpu*:*Mxfp8*:-Binary.*'
call_end
gg_summary
trainer_summary
