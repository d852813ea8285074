#!/usr/bin/env bash
# Graceful stop on a signal (stop_signal.hpp), on CPU ranks with the tiny model:
#   one process: SIGTERM mid-run -> the step ends, a checkpoint of that step is saved, exit status 75; rerunning
#                the command resumes there and the losses equal a run that was never stopped, bit for bit.
#   mpi:         EP=2 under mpirun; SIGUSR1 to rank 1 alone, then (a second run) to mpirun, which forwards it:
#                both ranks stop after the same step and save, and the resumed run equals the straight one.
# Usage: stop_signal.sh MXTRAIN_BINARY [mpi]
set -uo pipefail
BIN=$1
MODE=${2:-single}
source "$(dirname "${BASH_SOURCE[0]}")/mpi/common.sh"
TMP=$(mktemp -d)
JOB=""
cleanup() {
  [[ -n "$JOB" ]] && kill_tree "$JOB"
  rm -rf "$TMP"
}
trap cleanup EXIT
EXTRA=5  # steps trained after the resume

NP=1
LAUNCH=("$BIN")
if [[ $MODE == mpi ]]; then
  NP=2
  LAUNCH=("${MPIRUN[@]}" -np 2 "$BIN")
fi
ARGS=(--config-name L0_sanity "${TINY[@]}" parallelism.ep_size=$NP lr_scheduler_kwargs.num_decay_steps=2000)
step_losses() { grep -o '"step":[0-9]*,"total_steps":[0-9]*,"loss":[^,]*' "$1" | sed 's/,"total_steps":[0-9]*//'; }
lines() { if [[ -f $1 ]]; then wc -l <"$1"; else echo 0; fi; }

# interrupted NAME SIGNAL TARGET: a long run with checkpoints every 7 steps, sent SIGNAL after 3 logged steps
# (TARGET: "job" = the launched process, "rank1" = world rank 1 under mpirun). Sets STOP to the step it stopped at.
interrupted() {
  local name=$1 sig=$2 target=$3 out=$TMP/$1
  "${LAUNCH[@]}" "${ARGS[@]}" num_train_steps=2000 output_dir="$out" checkpoint.ckpt_dir="$out/ckpt" \
    checkpoint.save_every_n_steps=7 >"$out.log" 2>&1 &
  JOB=$!
  for ((i = 0; i < 600; i++)); do
    [[ $(lines "$out/metrics.jsonl") -ge 3 ]] && break
    kill -0 "$JOB" 2>/dev/null || { cat "$out.log"; fail "$name ended before it was signalled"; }
    sleep 0.1
  done
  [[ $(lines "$out/metrics.jsonl") -ge 3 ]] || { cat "$out.log"; fail "$name: training did not start in 60 s"; }
  local pid=$JOB
  if [[ $target == rank1 ]]; then pid=$(rank_pid "$JOB" 1) || fail "$name: no process of world rank 1"; fi
  kill -s "$sig" "$pid"
  wait_gone "$JOB" 60 || { cat "$out.log"; fail "$name still runs 60 s after $sig"; }
  wait "$JOB"
  local rc=$?
  JOB=""
  [[ $rc -eq 75 ]] || { cat "$out.log"; fail "$name: exit status $rc after $sig, expected 75"; }
  STOP=$(grep -oE "stopping after step [0-9]+" "$out.log" | grep -oE "[0-9]+$")
  [[ -n $STOP ]] || { cat "$out.log"; fail "$name: no 'stopping after step N' line"; }
  # mpirun forwards the signal to every rank, though not necessarily before the same step's loss reduction
  local caught=1
  [[ $target == job && $MODE == mpi ]] && caught="[1-$NP]"
  grep -q "SIG$sig on $caught of $NP rank(s): stopping after step $STOP, saving a checkpoint first" "$out.log" ||
    { cat "$out.log"; fail "$name: the stop line does not name SIG$sig on $caught of $NP ranks"; }
  grep -q "stopped at step $STOP of 2000 (checkpoint saved): run the same command to resume" "$out.log" ||
    { cat "$out.log"; fail "$name: no 'stopped at step $STOP' line"; }
  [[ -f $out/ckpt/step_$STOP/manifest.json ]] || { ls "$out/ckpt"; fail "$name: no complete checkpoint step_$STOP"; }
  [[ $(lines "$out/metrics.jsonl") -eq $STOP ]] || fail "$name: $(lines "$out/metrics.jsonl") metrics lines, not $STOP"
  echo "$name: SIG$sig to $target -> stopped after step $STOP, checkpoint saved, exit status 75"
}

# resumed NAME: the same command, now to STOP + EXTRA steps, equals a straight run of as many steps.
resumed() {
  local name=$1 out=$TMP/$1 total=$((STOP + EXTRA))
  "${LAUNCH[@]}" "${ARGS[@]}" num_train_steps=$total output_dir="$out" checkpoint.ckpt_dir="$out/ckpt" \
    checkpoint.save_every_n_steps=7 >>"$out.log" 2>&1 || { cat "$out.log"; fail "$name: the resumed run failed"; }
  grep -q "resumed from checkpoint $out/ckpt/step_$STOP at step $STOP" "$out.log" ||
    { cat "$out.log"; fail "$name: did not resume from step_$STOP"; }
  "${LAUNCH[@]}" "${ARGS[@]}" num_train_steps=$total output_dir="$TMP/straight_$name" >"$TMP/straight_$name.log" 2>&1 ||
    { cat "$TMP/straight_$name.log"; fail "$name: the straight run failed"; }
  diff <(step_losses "$TMP/straight_$name/metrics.jsonl") <(step_losses "$out/metrics.jsonl") ||
    fail "$name: losses differ from the straight run (above)"
  echo "$name: resumed at step $STOP, $total losses identical to a run that was never stopped"
}

if [[ $MODE == mpi ]]; then
  interrupted rank1 USR1 rank1
  resumed rank1
  interrupted mpirun USR1 job
  resumed mpirun
else
  interrupted term TERM job
  resumed term
fi
echo PASS
