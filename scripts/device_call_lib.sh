# Helpers for a device call's script (docs/data/sNN_callK_run.sh), sourced from the repository root on the device:
# the prebuilt binaries unpacked, every step started only before its own deadline (so that the call ends inside the
# device tool's limit and its logs always come back), the logs archived under $OUT and a summary printed.
#
#   source scripts/device_call_lib.sh
#   call_begin s55c1                       # m/ from devbin/bins.tgz; logs in $W; timeline, versions, GPU
#   step 150 tests -- m/main/mxtrain_tests --gtest_filter='*GroupedGemm*'      # timeout 150 s, logs $W/tests.txt
#   trainer 420 off1 8x7B-2layer MXTRAIN_GG_HALF_TAIL=off   # ours only, if started before 420 s
#   trainer 400 hf 8x7B-2layer --hf MXTRAIN_GG_HALF_TAIL=on # beside the HF baseline
#   trainer 420 b16 8x7B-2layer --set expert_grad_dtype=bfloat16   # a config override
#   call_end                               # $OUT/logs.tgz, the timeline, each test log's last lines
#
# BIN (default m/main) names the unpacked build the trainer runs use; INIT_CACHE (default /tmp/mxt-init-cache) the
# trainers' cache of initial weights; CALL_END (default 578) the second by which every step ends, lower for a call
# run under a shorter limit (less device time left) so that its logs still come back. Nothing starts after it, but
# a trainer run has no timeout: keep its start deadline a run's length below CALL_END.

set -u
BIN=${BIN:-m/main}
INIT_CACHE=${INIT_CACHE:-/tmp/mxt-init-cache}
CALL_END=${CALL_END:-578}

# One timeline line: seconds since the script started, then what happened.
t() { echo "$SECONDS s $*" >> "$W/timeline.txt"; }

# Whether there is time to start a step: true before DEADLINE seconds and CALL_END, else notes the skip.
ok() {
  local deadline=$1 what=$2
  [ "$SECONDS" -lt "$deadline" ] && [ "$SECONDS" -lt "$CALL_END" ] && return 0
  t "skipped: $what"
  return 1
}

call_begin() {
  local tag=$1
  if [ -f devbin/bins.tgz ]; then
    mkdir -p m && tar xzf devbin/bins.tgz -C m
  fi
  W=$(mktemp -d "/tmp/$tag.XXXX")
  : > "$W/timeline.txt"
  cat m/*/VERSION > "$W/versions.txt" 2>/dev/null || true
  nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,temperature.gpu --format=csv > "$W/gpu.txt" 2>&1 || true
}

# step TIMEOUT NAME [VAR=VAL ...] -- CMD...: runs CMD with the variables set, at most TIMEOUT seconds and only if
# that ends before second CALL_END; its output and exit status go to $W/NAME.txt.
step() {
  local limit=$1 name=$2 vars=()
  shift 2
  while [ $# -gt 0 ] && [ "$1" != -- ]; do vars+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  local left=$((CALL_END - SECONDS))
  [ "$left" -lt "$limit" ] && limit=$left
  [ "$limit" -gt 5 ] || { t "skipped: $name"; return 1; }
  env ${vars[@]+"${vars[@]}"} timeout "$limit" "$@" > "$W/$name.txt" 2>&1
  local rc=$?
  echo "rc $rc" >> "$W/$name.txt"
  t "$name rc $rc"
  return 0
}

# trainer DEADLINE NAME PRESET [--hf] [--set KEY=VALUE ...] [VAR=VAL ...]: scripts/bench_trainer.py on one preset,
# ours alone or (--hf) beside the HF baseline, with our config's overrides and the variables set; logs in
# $W/tr_NAME.txt, its files in $W/tr_NAME/.
trainer() {
  local deadline=$1 name=$2 preset=$3 hf=none sets=()
  shift 3
  if [ "${1:-}" = --hf ]; then
    hf=$BIN/hf_baseline.py
    shift
  fi
  while [ "${1:-}" = --set ]; do sets+=(--set "$2"); shift 2; done
  ok "$deadline" "trainer $name" || return 1
  env "$@" python3 scripts/bench_trainer.py --init-cache "$INIT_CACHE" --mxtrain "$BIN/mxtrain" --hf-baseline "$hf" \
    ${sets[@]+"${sets[@]}"} --sample-gpu --out "$W/tr_$name" "$preset" > "$W/tr_$name.txt" 2>&1
  t "trainer $name rc $?"
}

# Whether this card holds the 8x7B 2-layer step (it plans 75.4 GiB, measured peak 75.40): true from 80,000 MiB (an
# H100 reports 81,559), else notes the skip.
fits_8x7B() {
  local mib
  mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
  [ "${mib:-0}" -ge 80000 ] && return 0
  t "trainer runs skipped: ${mib:-no} MiB on this card, the step plans 75.4 GiB"
  return 1
}

# rotating_rows NAME...: each bench_grouped_gemm log's ($W/NAME.txt) rotating rows with the spaces squeezed.
rotating_rows() {
  local f
  for f in "$@"; do
    echo "== $f"
    grep -h 'rotating' "$W/$f.txt" | grep -v '^|' | sed 's/ \+/ /g' | cut -c1-120
  done
}

# The trainer runs' result lines, one per run: the tok/s table's row, then each run's median SM clock (ours, HF).
trainer_summary() {
  local f
  for f in "$W"/tr_*.txt; do
    [ -f "$f" ] || continue
    echo "$(basename "$f" .txt): $(grep '^| 8x\|^| L0' "$f" | tail -1 | cut -c1-110) MHz: $(grep '^| 8x\|^| L0' "$f" |
      grep '% |$' | awk -F'|' '{printf "%s", $4}')"
  done
}

call_end() {
  nvidia-smi --query-gpu=temperature.gpu,clocks.sm --format=csv >> "$W/gpu.txt" 2>&1 || true
  (cd "$W" && tar czf "${OUT:?OUT: the device tool output folder}/logs.tgz" .)
  echo "== timeline"
  cat "$W/timeline.txt"
  local f
  for f in "$W"/tests*.txt; do
    [ -f "$f" ] || continue
    echo "-- $(basename "$f"): $(grep -E '^\[  (PASSED|FAILED)  \]' "$f" | tr '\n' ' ') $(tail -n1 "$f")"
  done
}

# The half units' lines of $W/tests_gg.txt and, per bench_grouped_gemm log ($W/gg_*.txt), its CTA-pair and
# alternating rows with the spaces squeezed.
gg_summary() {
  grep -h "half units\]" "$W/tests_gg.txt" 2>/dev/null | head -12
  local f
  for f in "$W"/gg_*.txt; do
    [ -f "$f" ] || continue
    echo "-- $(basename "$f")"
    grep "sm90 128x256 c2  \|sm90 128x256 c2,\|alternating" "$f" | sed 's/ \+/ /g' | cut -c1-120
  done
}
