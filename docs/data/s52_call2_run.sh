#!/usr/bin/env bash
# Prepared in session 52 (no device lent), for the next session's second call, after call 1 (s52_call1_run.sh) has
# picked the lockstep setting: BEST="VAR=value ..." (default: main as it is). Same bins.tgz as call 1 (main/, wip/).
#  1. 8x7B 2 layers beside HF, two rounds, with BEST on BIN (issue 4's figure; --sample-gpu for the clock);
#  2. DRAM bytes of the trainer's expert weight-gradient launches (2 steps: 8 launches, W13 and W2 of 2 layers)
#     under ncu, main's item lockstep against the k-block gate and serpentine; then the forward / dgrad launches of
#     the first micro-batches, main against the k-block gate: session 52's model says the W13 call re-reads
#     dh13 once per x n-tile (16 x 3.76 GB = 60 GB, as measured in session 51) when the CTAs sharing a dh13
#     strip drift apart, and needs about 18 GB when they stay within L2's window.
set -u
BIN=${BIN:-main}
BEST=${BEST:-X=1}
mkdir -p m && tar xzf devbin/bins.tgz -C m
W=$(mktemp -d /tmp/s52c2.XXXX)
t() { echo "$SECONDS s $*" >> $W/timeline.txt; }
for r in 1 2; do
  env $BEST python3 scripts/bench_trainer.py --init-cache /tmp/mxt-init-cache --mxtrain m/$BIN/mxtrain --hf-baseline m/main/hf_baseline.py --sample-gpu \
    --out $W/hf$r 8x7B-2layer > $W/hf$r.txt 2>&1; t "hf round $r"
done
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
nc() { local name=$1 bin=$2 kre=$3 count=$4; shift 4; [ $SECONDS -lt 480 ] || { t "skipped ncu $name"; return; }
  env MXTRAIN_INIT_CACHE=/tmp/mxt-init-cache "$@" timeout 120 "$NCU" --clock-control none --kernel-name-base mangled -k regex:"$kre" --launch-count $count \
    --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,gpu__time_duration.sum --csv \
    --log-file $W/ncu_$name.csv m/$bin/mxtrain --config-name bench_8x7B_2layer backend=cuda dataset.source=random \
    num_train_steps=2 > $W/ncu_$name.log 2>&1; t "ncu $name rc $?"; }
nc main main 'ModeE2E' 8 X=1
nc kb16 wip 'ModeE2E' 8 MXTRAIN_GG_LOCKSTEP_KB=16
nc serp wip 'ModeE2E' 8 MXTRAIN_GG_LOCKSTEP_KB=16 MXTRAIN_GG_WGRAD_SERPENTINE=on
# the forward and dgrad pairs kernels (modes 0, 1) of the first micro-batches: main, then gated every 8 k-blocks
nc rows_main main 'ModeE[01]E' 16 X=1
nc rows_kb8 wip 'ModeE[01]E' 16 MXTRAIN_GG_ROWS_LOCKSTEP=on MXTRAIN_GG_LOCKSTEP_KB=8
cd $W && tar czf $OUT/logs.tgz .
echo "== summary"; cat $W/timeline.txt; grep -h "^| 8x7B" $W/hf*.txt
for f in $W/ncu_*.csv; do echo "-- $(basename $f)"; python3 - "$f" <<'PY'
import csv, sys, collections
rows = collections.OrderedDict()
lines = [l for l in open(sys.argv[1]) if l.startswith('"')]
for r in csv.DictReader(lines):
    k = r["ID"]; rows.setdefault(k, {"grid": r.get("Grid Size", ""), "name": r["Kernel Name"][-40:]})
    rows[k][r["Metric Name"]] = (r["Metric Value"], r["Metric Unit"])
for k, v in rows.items():
    print(k, v["grid"], {m: v[m] for m in v if "__" in m})
PY
done
