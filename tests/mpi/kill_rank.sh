#!/usr/bin/env bash
# Failure handling: rank 1 of `mpirun -np 2 mxtrain` (EP=2) is SIGKILLed mid-run. The job must end within
# 60 s with a non-zero exit and a message naming the lost rank (Open MPI's "process rank 1 ... signal 9").
# With `hang` as second argument, rank 1 is SIGSTOPped instead (a hang): the others' collective watchdog
# (parallelism.timeout_s=5) must end the job, naming the collective and the group. In kill mode the timeout
# stays at 600 s: the job must end through Open MPI noticing the lost rank, not through the watchdog.
# Usage: kill_rank.sh MXTRAIN_BINARY [kill|hang]
# MXT_KILL_ARGS="..." replaces the tiny CPU model's overrides (the GPU machine runs it with backend=cuda).
set -uo pipefail
BIN=$1
MODE=${2:-kill}
TIMEOUT=600
[[ $MODE == hang ]] && TIMEOUT=5
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
TMP=$(mktemp -d)
JOB=""
VICTIM=""
cleanup() {  # only what this script started, by pid
  [[ -n "$VICTIM" ]] && kill -KILL "$VICTIM" 2>/dev/null
  [[ -n "$JOB" ]] && kill_tree "$JOB"
  rm -rf "$TMP"
}
trap cleanup EXIT

ARGS=("${TINY[@]}")
[[ -n ${MXT_KILL_ARGS:-} ]] && read -ra ARGS <<<"$MXT_KILL_ARGS"
"${MPIRUN[@]}" -np 2 "$BIN" --config-name L0_sanity "${ARGS[@]}" parallelism.ep_size=2 num_train_steps=1000000 \
  parallelism.timeout_s="$TIMEOUT" output_dir="$TMP" >"$TMP/out.log" 2>&1 &
JOB=$!
for ((i = 0; i < 600; i++)); do  # until training is under way: two logged steps
  [[ $(wc -l <"$TMP/metrics.jsonl" 2>/dev/null || echo 0) -ge 2 ]] && break
  kill -0 "$JOB" 2>/dev/null || { cat "$TMP/out.log"; fail "the job ended before the test could interfere"; }
  sleep 0.1
done
[[ $(wc -l <"$TMP/metrics.jsonl" 2>/dev/null || echo 0) -ge 2 ]] || { cat "$TMP/out.log"; fail "training did not start in 60 s"; }
VICTIM=$(rank_pid "$JOB" 1) || fail "no process of world rank 1 under mpirun $JOB"
if [[ $MODE == hang ]]; then kill -STOP "$VICTIM"; else kill -KILL "$VICTIM"; fi
t0=$SECONDS
wait_gone "$JOB" 60 || { cat "$TMP/out.log"; fail "the job still runs 60 s after rank 1 was ${MODE}ed"; }
wait "$JOB"
rc=$?
JOB=""
echo "job ended $((SECONDS - t0)) s after rank 1 was ${MODE}ed, exit status $rc"
cat "$TMP/out.log" | tail -20
[[ $rc -ne 0 ]] || fail "exit status 0 after losing a rank"
if [[ $MODE == hang ]]; then
  grep -q "did not complete within parallelism.timeout_s=5" "$TMP/out.log" || fail "no watchdog message"
  grep -Eq "on the (ep|world) group \(world ranks 0,1\)" "$TMP/out.log" || fail "the message does not name the group"
else
  grep -Eq "rank 1 .*(signal 9|Killed)" "$TMP/out.log" || fail "no message naming the lost rank 1"
fi
echo PASS
