set -u
mkdir -p m && tar xzf devbin/bins.tgz -C m
W=$(mktemp -d /tmp/s53c3.XXXX)
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
nc() { local name=$1 bin=$2 kre=$3 count=$4; shift 4; [ $SECONDS -lt 400 ] || { echo "skipped $name" >> $W/timeline.txt; return; }
  env MXTRAIN_INIT_CACHE=/tmp/mxt-init-cache "$@" timeout -k 5 230 "$NCU" --clock-control none --kernel-name-base mangled -k regex:"$kre" --launch-count $count \
    --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,gpu__time_duration.sum --csv \
    --log-file $W/ncu_$name.csv m/$bin/mxtrain --config-name bench_8x7B_2layer backend=cuda dataset.source=random \
    num_train_steps=1 > $W/ncu_$name.log 2>&1; echo "$SECONDS s ncu $name rc $?" >> $W/timeline.txt; pkill -9 -f m/$bin/mxtrain; sleep 2; }
nc kb16 wip 'ModeE2E' 4 MXTRAIN_GG_LOCKSTEP_KB=16
nc rows_kb8 wip 'ModeE[01]E' 4 MXTRAIN_GG_ROWS_LOCKSTEP=on MXTRAIN_GG_LOCKSTEP_KB=8
cd $W && tar czf $OUT/logs.tgz .
cat $W/timeline.txt
for f in $W/ncu_*.csv; do echo "-- $(basename $f)"; python3 - "$f" <<'PY'
import csv, sys, collections
rows = collections.OrderedDict()
lines = [l for l in open(sys.argv[1]) if l.startswith('"')]
for r in csv.DictReader(lines):
    k = r["ID"]; rows.setdefault(k, {})
    rows[k][r["Metric Name"]] = r["Metric Value"]
for k, v in rows.items(): print(k, v)
PY
done
