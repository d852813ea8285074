#!/usr/bin/env bash
# Session 59, call 1 (H200). bins.tgz holds main/ = this session's build of main
# (`bash scripts/pack_devbin.sh --only mxtrain_tests,bench_grouped_gemm devbin/bins.tgz main=build`).
#  1. the split-master GPU test as rewritten in 7237f65 (never run on a GPU), with the bf16-gradient tests;
#  2. bench_grouped_gemm's wgrad rows at 8x7B, now with one call storing a bf16 dW beside cuBLASLt storing bf16;
#  3. with the bf16 dW (whose epilogue is half the fp32 one) the wgrad schedule knobs again, 8x7B, alternating:
#     default / lockstep off / tails in place / raster groups of 8 / CTA pairs over n;
#  4. issue 4's figures beside HF with bench_trainer.py's presets (both recipe options): 8x7B 2 layers, 8x1B;
#  5. every CUDA test.
set -u
source scripts/device_call_lib.sh
call_begin s59c1
step 150 tests_new -- m/main/mxtrain_tests --gtest_filter='CudaMasterRemainders.*:CudaExpertWgradGroup.Bf16*:CudaBasicOps.AdamWBf16*'
step 90 gg_wgrad -- m/main/bench_grouped_gemm --no-wmma --shape 8x7B --ops wgrad --runs 10
for r in 1 2; do
  trainer 300 def_$r 8x7B-2layer
  trainer 300 lockoff_$r 8x7B-2layer MXTRAIN_GG_WGRAD_LOCKSTEP=off
  trainer 300 gathoff_$r 8x7B-2layer MXTRAIN_GG_WGRAD_GATHER=off
  trainer 300 grp8_$r 8x7B-2layer MXTRAIN_GG_WGRAD_GROUP=8
  trainer 300 pairn_$r 8x7B-2layer MXTRAIN_GG_WGRAD_PAIR=n
done
trainer 300 def_3 8x7B-2layer
trainer 340 hf_8x7B 8x7B-2layer --hf
trainer 420 hf_8x1B 8x1B --hf
ok 460 tests-all && step 578 tests_all -- m/main/mxtrain_tests --gtest_filter='*Cuda*:*Gpu*:*Mxfp8*:-Binary.*'
call_end
grep -h "remainders\]\|spread" $W/tests_new.txt | head -8
grep -h "bf16 dW stored\|alternating with c2" $W/gg_wgrad.txt | sed 's/ \+/ /g' | cut -c1-170
trainer_summary
