#!/usr/bin/env bash
# Session 54, call 1: branch wip/s54-rows-a (the forward / dgrad grouped GEMM's A in 64-row halves, an odd-tail
# unit's halves multicast; MXTRAIN_GG_ROWS_A=trim|full). bins.tgz holds main/ = that branch's build
# (`bash scripts/pack_devbin.sh --only mxtrain_tests,bench_grouped_gemm devbin/bins.tgz main=build`). Each step
# starts only before its deadline, so the archive always comes back. Most important first:
#  1. the grouped GEMM's CUDA tests with trim (the default), and the fault rowsa (must fail the new test);
#  2. the 8x7B step, full / trim alternating, three rounds (ours only);
#  3. bench_grouped_gemm forward / dgrad, full / trim, two rounds;
#  4. issue 4's 8x7B figure: trim beside HF;  5. 8x1B full / trim;  6. every CUDA test.
set -u
mkdir -p m && tar xzf devbin/bins.tgz -C m
W=$(mktemp -d /tmp/s54c1.XXXX)
cat m/*/VERSION > $W/versions.txt
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,temperature.gpu --format=csv > $W/gpu.txt
t() { echo "$SECONDS s $*" >> $W/timeline.txt; }
ok() { [ $SECONDS -lt ${1:-530} ] || { t "skipped: $2"; return 1; }; }
timeout 150 m/main/mxtrain_tests --gtest_filter='*GroupedGemm*:GroupedSchedule.*:CudaExpertWgradGroup.*:CudaMoe*' > $W/tests_gg.txt 2>&1; echo "rc $?" >> $W/tests_gg.txt; t tests-gg
MXTRAIN_GG_FAULT=rowsa timeout 60 m/main/mxtrain_tests --gtest_filter='*RowsAInHalves*' > $W/tests_fault.txt 2>&1; echo "rc $? (the fault: must fail)" >> $W/tests_fault.txt; t tests-fault
trn() { local name=$1 preset=$2; shift 2; ok 420 "tr $name" || return; env "$@" python3 scripts/bench_trainer.py --init-cache /tmp/mxt-init-cache --mxtrain m/main/mxtrain --hf-baseline none --sample-gpu --out $W/tr_$name $preset > $W/tr_$name.txt 2>&1; t "tr $name"; }
for r in 1 2 3; do
  trn full$r 8x7B-2layer MXTRAIN_GG_ROWS_A=full
  trn trim$r 8x7B-2layer MXTRAIN_GG_ROWS_A=trim
done
G="--no-wmma --shape 8x7B --runs 10"
gg() { local name=$1; shift; ok 450 "gg $name" || return; env "$@" timeout 60 m/main/bench_grouped_gemm $G --ops fwd,dgrad > $W/gg_$name.txt 2>&1; t "gg $name"; }
gg full1 MXTRAIN_GG_ROWS_A=full; gg trim1 MXTRAIN_GG_ROWS_A=trim; gg full2 MXTRAIN_GG_ROWS_A=full; gg trim2 MXTRAIN_GG_ROWS_A=trim
ok 400 hf && { python3 scripts/bench_trainer.py --init-cache /tmp/mxt-init-cache --mxtrain m/main/mxtrain --hf-baseline m/main/hf_baseline.py --sample-gpu --out $W/hf 8x7B-2layer > $W/hf.txt 2>&1; t hf; }
trn 8x1B_full 8x1B MXTRAIN_GG_ROWS_A=full
trn 8x1B_trim 8x1B MXTRAIN_GG_ROWS_A=trim
ok 440 tests-all && { timeout $((578 - SECONDS)) m/main/mxtrain_tests --gtest_filter='*Cuda*:*Gpu*:*Mxfp8*:-Binary.*' > $W/tests_all.txt 2>&1; echo "rc $?" >> $W/tests_all.txt; t tests-all; }
nvidia-smi --query-gpu=temperature.gpu,clocks.sm --format=csv >> $W/gpu.txt
cd $W && tar czf $OUT/logs.tgz .
echo "== summary"; cat $W/timeline.txt; tail -n2 $W/tests_*.txt
for f in $W/gg_*.txt; do echo "-- $(basename $f)"; grep "sm90 128x256 c2  \|sm90 128x256 c2,\|alternating" $f | sed 's/ \+/ /g' | cut -c1-120; done
for f in $W/tr_*.txt $W/hf.txt; do echo "$(basename $f .txt): $(grep '^| 8x' $f | head -1 | cut -c1-110) $(grep -o '[0-9]* MHz[^|]*' $f | head -2 | tr '\n' ' ')"; done
