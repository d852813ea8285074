#!/usr/bin/env bash
# Prepared in session 52 (no device was lent: never run) for the next session's first call. bins.tgz holds main/ (a
# build of main) and wip/ (main with docs/data/s52_wip_lockstep_kb.patch applied by `git am`), each with mxtrain,
# mxtrain_tests and bench_grouped_gemm (and hf_baseline.py): `bash scripts/pack_devbin.sh --only
# mxtrain_tests,bench_grouped_gemm devbin/bins.tgz main=MAIN_BUILD wip=WIP_BUILD` (about 50 MB; two full packs exceed
# the 64 MiB carry). Each step starts only before its deadline, so the archive always comes back. The trainer runs
# share one init cache (--init-cache: main since session 52): the first draws and writes the 8x7B weights (15.8 GB under
# /tmp/mxt-init-cache), the others read them back (about 10 s less each; the timed steps do not change). What it runs, most important first:
#  1. the 8x7B step (ours only), two rounds of: main; wip as it is (item lockstep: the kinfo hand-over and the
#     producer's spills alone); wip with the k-block gate (KB=16, and KB=32: a gate is a partial barrier, so a
#     tighter one also makes CTAs wait on each other's jitter); + the forward / dgrad gate; + serpentine wgrad;
#  2. the wip tests of the gates, serpentine and SetCursor (bit for bit / against the CPU twin);
#  3. GEMM rows: the trainer-shape weight gradient (main; KB=16; KB=16 + serpentine; KB=16 + raster groups of 8),
#     forward / dgrad (main; rows gate KB=8), the single-call weight gradient (main; lockstep on; + KB=8 + serpentine);
#  4. main's CUDA tests.
# Session 52's LRU model (docs/data/s52_wgrad_l2_model.py) predicts the trainer's W13 weight gradient reads about
# 60 GB from DRAM with the CTAs ~1.5 items apart (session 51 measured 57.6-64.6), about 43 GB within one item (the
# item lockstep's bound), 21 GB within 32 k-blocks (KB=16), 13.6 GB with serpentine, 17 GB with groups of 8.
set -u
mkdir -p m && tar xzf devbin/bins.tgz -C m
W=$(mktemp -d /tmp/s53c1.XXXX)
cat m/*/VERSION > $W/versions.txt
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,temperature.gpu --format=csv > $W/gpu.txt
t() { echo "$SECONDS s $*" >> $W/timeline.txt; }
ok() { [ $SECONDS -lt ${1:-530} ] || { t "skipped: $2"; return 1; }; }
tr() { local name=$1 bin=$2; shift 2; ok 350 "tr $name" || return; env "$@" python3 scripts/bench_trainer.py --init-cache /tmp/mxt-init-cache --mxtrain m/$bin/mxtrain --hf-baseline none --out $W/tr_$name 8x7B-2layer > $W/tr_$name.txt 2>&1; t "tr $name"; }
for r in 1 2; do
  tr main$r main X=1
  tr wip$r wip X=1
  tr kb$r wip MXTRAIN_GG_LOCKSTEP_KB=16
  tr kb32_$r wip MXTRAIN_GG_LOCKSTEP_KB=32
  tr kbrows$r wip MXTRAIN_GG_LOCKSTEP_KB=16 MXTRAIN_GG_ROWS_LOCKSTEP=on
  tr kbserp$r wip MXTRAIN_GG_LOCKSTEP_KB=16 MXTRAIN_GG_ROWS_LOCKSTEP=on MXTRAIN_GG_WGRAD_SERPENTINE=on
done
ok 400 tests-wip && { timeout 90 m/wip/mxtrain_tests --gtest_filter='*Lockstep*:*Serpentine*:GroupedSchedule.*:CudaGroupedGemmSwiglu.*:CudaExpertWgradGroup.*' > $W/tests_wip.txt 2>&1; echo "rc $?" >> $W/tests_wip.txt; t tests-wip; }
G="--no-wmma --shape 8x7B --runs 10"
gg() { local name=$1 bin=$2 ops=$3; shift 3; ok 520 "gg $name" || return; env "$@" timeout 60 m/$bin/bench_grouped_gemm $G --ops $ops > $W/gg_$name.txt 2>&1; t "gg $name"; }
gg tw_main main "wgrad --trainer-call" X=1
gg tw_kb16 wip "wgrad --trainer-call" MXTRAIN_GG_LOCKSTEP_KB=16
gg tw_serp wip "wgrad --trainer-call" MXTRAIN_GG_LOCKSTEP_KB=16 MXTRAIN_GG_WGRAD_SERPENTINE=on
gg tw_group8 wip "wgrad --trainer-call" MXTRAIN_GG_LOCKSTEP_KB=16 MXTRAIN_GG_WGRAD_GROUP=8
gg rows_main main fwd,dgrad X=1
gg rows_kb8 wip fwd,dgrad MXTRAIN_GG_ROWS_LOCKSTEP=on MXTRAIN_GG_LOCKSTEP_KB=8
gg wgrad_main main wgrad X=1
gg wgrad_ls main wgrad MXTRAIN_GG_WGRAD_LOCKSTEP=on
gg wgrad_serp wip wgrad MXTRAIN_GG_WGRAD_LOCKSTEP=on MXTRAIN_GG_LOCKSTEP_KB=8 MXTRAIN_GG_WGRAD_SERPENTINE=on
ok 450 tests-main && { timeout $((578 - SECONDS)) m/main/mxtrain_tests --gtest_filter='*Cuda*:*Gpu*:*Mxfp8*:-Binary.*' > $W/tests_main.txt 2>&1; echo "rc $?" >> $W/tests_main.txt; t tests-main; }
nvidia-smi --query-gpu=temperature.gpu,clocks.sm --format=csv >> $W/gpu.txt
cd $W && tar czf $OUT/logs.tgz .
echo "== summary"; cat $W/timeline.txt; tail -n3 $W/tests_*.txt
for f in $W/gg_*.txt; do echo "-- $(basename $f)"; grep "^  " $f | grep "alternating\|the trainer's call\|dense  " | grep -v "tail none\|tails in place\|norm" | sed 's/ \+/ /g' | cut -c1-150; done
grep -h "^| 8x7B" $W/tr_*.txt
