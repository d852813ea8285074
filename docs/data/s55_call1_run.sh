#!/usr/bin/env bash
# Session 55's call, for the next session lent a GPU (session 55 was lent none): branch wip/s55-half-tail (the
# forward / dgrad grouped GEMM's half units, MXTRAIN_GG_HALF_TAIL=off|on; patch docs/data/s55_wip_half_tail.patch,
# `git am` on main cd8a89a). bins.tgz holds main/ = that branch's build
# (`bash scripts/pack_devbin.sh --only mxtrain_tests,bench_grouped_gemm devbin/bins.tgz main=build`); with the knob off
# its forward / dgrad kernels are main's (same instruction and spill counts per kernel). Each step starts only
# before its deadline, so the archive always comes back. Most important first:
#  1. the grouped GEMM's CUDA tests (HalfUnitsAddUp, HalfUnitsChangeOnlyTheirRows among them), and the fault
#     halfsum (must fail HalfUnitsAddUp);
#  2. the 8x7B step, off / on alternating, three rounds (ours only);
#  3. bench_grouped_gemm forward / dgrad at one 8x7B micro-batch's rows (8x7B-mb1), off / on, two rounds;
#  4. issue 4's 8x7B figure: on beside HF;  5. 8x1B off / on;  6. every CUDA test with half units on.
set -u
mkdir -p m && tar xzf devbin/bins.tgz -C m
W=$(mktemp -d /tmp/s55c1.XXXX)
cat m/*/VERSION > $W/versions.txt
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,temperature.gpu --format=csv > $W/gpu.txt
t() { echo "$SECONDS s $*" >> $W/timeline.txt; }
ok() { [ $SECONDS -lt ${1:-530} ] || { t "skipped: $2"; return 1; }; }
timeout 150 m/main/mxtrain_tests --gtest_filter='*GroupedGemm*:GroupedSchedule.*:CudaExpertWgradGroup.*:CudaMoe*' > $W/tests_gg.txt 2>&1; echo "rc $?" >> $W/tests_gg.txt; t tests-gg
MXTRAIN_GG_FAULT=halfsum timeout 60 m/main/mxtrain_tests --gtest_filter='*HalfUnitsAddUp*' > $W/tests_fault.txt 2>&1; echo "rc $? (the fault: must fail)" >> $W/tests_fault.txt; t tests-fault
trn() { local name=$1 preset=$2; shift 2; ok 420 "trainer $name" || return; env "$@" python3 scripts/bench_trainer.py --init-cache /tmp/mxt-init-cache --mxtrain m/main/mxtrain --hf-baseline none --sample-gpu --out $W/tr_$name $preset > $W/tr_$name.txt 2>&1; t "trainer $name"; }
for r in 1 2 3; do
  trn off$r 8x7B-2layer MXTRAIN_GG_HALF_TAIL=off
  trn on$r 8x7B-2layer MXTRAIN_GG_HALF_TAIL=on
done
G="--no-wmma --shape 8x7B-mb1 --runs 10"
gg() { local name=$1; shift; ok 450 "gg $name" || return; env "$@" timeout 60 m/main/bench_grouped_gemm $G --ops fwd,dgrad > $W/gg_$name.txt 2>&1; t "gg $name"; }
gg off1 MXTRAIN_GG_HALF_TAIL=off; gg on1 MXTRAIN_GG_HALF_TAIL=on; gg off2 MXTRAIN_GG_HALF_TAIL=off; gg on2 MXTRAIN_GG_HALF_TAIL=on
ok 400 hf && { MXTRAIN_GG_HALF_TAIL=on python3 scripts/bench_trainer.py --init-cache /tmp/mxt-init-cache --mxtrain m/main/mxtrain --hf-baseline m/main/hf_baseline.py --sample-gpu --out $W/hf 8x7B-2layer > $W/hf.txt 2>&1; t hf; }
trn 8x1B_off 8x1B MXTRAIN_GG_HALF_TAIL=off
trn 8x1B_on 8x1B MXTRAIN_GG_HALF_TAIL=on
ok 440 tests-all && { MXTRAIN_GG_HALF_TAIL=on timeout $((578 - SECONDS)) m/main/mxtrain_tests --gtest_filter='*Cuda*:*Gpu*:*Mxfp8*:-Binary.*' > $W/tests_all.txt 2>&1; echo "rc $?" >> $W/tests_all.txt; t tests-all; }
nvidia-smi --query-gpu=temperature.gpu,clocks.sm --format=csv >> $W/gpu.txt
cd $W && tar czf $OUT/logs.tgz .
echo "== summary"; cat $W/timeline.txt; tail -n2 $W/tests_*.txt
grep -h "half units\]" $W/tests_gg.txt | head -12
for f in $W/gg_*.txt; do echo "-- $(basename $f)"; grep "sm90 128x256 c2  \|sm90 128x256 c2,\|alternating" $f | sed 's/ \+/ /g' | cut -c1-120; done
for f in $W/tr_*.txt $W/hf.txt; do echo "$(basename $f .txt): $(grep '^| 8x' $f | head -1 | cut -c1-110) $(grep -o '[0-9]* MHz[^|]*' $f | head -2 | tr '\n' ' ')"; done
