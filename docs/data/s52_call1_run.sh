#!/usr/bin/env bash
# Prepared in session 52 (no device was lent: never run) for the next session's first call. bins.tgz holds main/ (a
# build of main) and wip/ (main with docs/data/s52_wip_lockstep_kb.patch applied by `git am`), each with mxtrain,
# mxtrain_tests and bench_grouped_gemm (main/ also hf_baseline.py): pack each with scripts/pack_devbin.sh and keep
# only those files (two full packs exceed the 64 MiB carry). What it runs: the 8x7B step alternating main / wip
# lockstep settings; the trainer-shape, forward / dgrad and single-call GEMM rows with the gates; the wip lockstep
# tests; main's CUDA tests (as time allows: each step starts only before its deadline).
set -u
mkdir -p m && tar xzf devbin/bins.tgz -C m
W=$(mktemp -d /tmp/s52c1.XXXX)
cat m/*/VERSION > $W/versions.txt
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,temperature.gpu --format=csv > $W/gpu.txt
t() { echo "$SECONDS s $*" >> $W/timeline.txt; }
ok() { [ $SECONDS -lt ${1:-530} ] || { t "skipped: $2"; return 1; }; }
tr() { local name=$1 bin=$2; shift 2; ok 520 "tr $name" || return; env "$@" python3 scripts/bench_trainer.py --mxtrain m/$bin/mxtrain --hf-baseline none --out $W/tr_$name 8x7B-2layer > $W/tr_$name.txt 2>&1; t "tr $name"; }
for r in 1 2; do
  tr main$r main X=1
  tr rows$r wip MXTRAIN_GG_ROWS_LOCKSTEP=on
  tr kb16_$r wip MXTRAIN_GG_LOCKSTEP_KB=16
  tr both$r wip MXTRAIN_GG_ROWS_LOCKSTEP=on MXTRAIN_GG_LOCKSTEP_KB=16
done
ok 500 tests-wip && { timeout 120 m/wip/mxtrain_tests --gtest_filter='*Lockstep*:CudaGroupedGemmSwiglu.*:*CudaGroupedGemmSm90*:CudaExpertWgradGroup.*' > $W/tests_wip.txt 2>&1; echo "rc $?" >> $W/tests_wip.txt; t tests-wip; }
G="--no-wmma --shape 8x7B --runs 10"
gg() { local name=$1 bin=$2 ops=$3; shift 3; ok 540 "gg $name" || return; env "$@" timeout 90 m/$bin/bench_grouped_gemm $G --ops $ops > $W/gg_$name.txt 2>&1; t "gg $name"; }
gg tw_main main "wgrad --trainer-wgrad" X=1
gg tw_kb16 wip "wgrad --trainer-wgrad" MXTRAIN_GG_LOCKSTEP_KB=16
gg rows_main main fwd,dgrad X=1
gg rows_on wip fwd,dgrad MXTRAIN_GG_ROWS_LOCKSTEP=on
gg wgrad_main main wgrad X=1
gg wgrad_ls main wgrad MXTRAIN_GG_WGRAD_LOCKSTEP=on
gg wgrad_kb8 wip wgrad MXTRAIN_GG_WGRAD_LOCKSTEP=on MXTRAIN_GG_LOCKSTEP_KB=8
ok 460 tests-main && { timeout $((575 - SECONDS)) m/main/mxtrain_tests --gtest_filter='*Cuda*:*Gpu*:*Mxfp8*:-Binary.*' > $W/tests_main.txt 2>&1; echo "rc $?" >> $W/tests_main.txt; t tests-main; }
nvidia-smi --query-gpu=temperature.gpu,clocks.sm --format=csv >> $W/gpu.txt
cd $W && tar czf $OUT/logs.tgz .
echo "== summary"; cat $W/timeline.txt; tail -n3 $W/tests_*.txt
for f in $W/gg_*.txt; do echo "-- $(basename $f)"; grep "^  " $f | grep "alternating\|the trainer's call\|dense  " | grep -v "tail none\|tails in place\|norm" | sed 's/ \+/ /g' | cut -c1-150; done
grep -h "^| 8x7B" $W/tr_*.txt
