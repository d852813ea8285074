#!/usr/bin/env bash
# Checkpoint resume and resharding with the mxtrain binary on CPU ranks (tiny L0_sanity shape, N steps, 4
# micro-batches per step in every layout: grad_acc_steps = 4 / ranks):
#   exact:   EP=2 and DP=2 on 2 ranks, N/2 steps + stop + resume for N/2 == N straight, loss strings bit for bit
#            (DP=2 saves with async_save); and EP=2 with experts re-placed after every step (ep_rebalance_interval)
#   reshard: saved at EP=2 (2 ranks), resumed at EP=1 (1 rank), at DP=2 (2 ranks) and at DP=2 x EP=2 (4 ranks,
#            with the final HF export); saved at EP=1 (1 rank, async_save), resumed at EP=2. Every step is in
#            the metrics file once, each loss within 1e-5 relative of the EP=2 run that never stopped.
# Also checks the save / resume timing lines (GB, s, GB/s; the step loop's stall under async_save).
# Usage: resume_reshard.sh MXTRAIN_BINARY
set -uo pipefail
BIN=$1
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
N=8
HALF=$((N / 2))
MICRO=4  # micro-batches per step over all ranks

# train NAME DP EP STEPS [extra overrides]: dp x ep ranks; output in $TMP/NAME, log in $TMP/NAME.log.
train() {
  local name=$1 dp=$2 ep=$3 steps=$4
  shift 4
  local np=$((dp * ep))
  local cmd=("$BIN" --config-name L0_sanity "${TINY[@]}" parallelism.dp_size="$dp" parallelism.ep_size="$ep"
             grad_acc_steps=$((MICRO / np)) num_train_steps="$steps" output_dir="$TMP/$name" "$@")
  [[ $np -gt 1 ]] && cmd=("${MPIRUN[@]}" -np "$np" "${cmd[@]}")
  timeout 120 "${cmd[@]}" >>"$TMP/$name.log" 2>&1
  local rc=$?
  [[ $rc -eq 0 ]] || { cat "$TMP/$name.log"; fail "$name: exit status $rc"; }
}
# ckpt DIR: save every HALF steps into DIR, resume from it.
ckpt() { echo checkpoint.ckpt_dir="$1" checkpoint.save_every_n_steps=$HALF checkpoint.resume_from_checkpoint=true; }
# step:loss strings of a metrics file, in file order (the exact text the trainer wrote).
step_losses() { grep -o '"step":[0-9]*,"total_steps":[0-9]*,"loss":[^,]*' "$1" | sed 's/,"total_steps":[0-9]*//'; }
# NAME's log has the line matching the extended regex $2.
logged() { grep -Eq "$2" "$TMP/$1.log" || { cat "$TMP/$1.log"; fail "$1: no line matching '$2'"; }; }
resumed_at() {
  logged "$1" "resumed from checkpoint $2/step_$HALF at step $HALF: loaded $NUM GB in $NUM s \($NUM GB/s\)"
}
NUM='[0-9]+\.[0-9]+'
# The save lines: sync (size, time, rate, stall) or async (stall and snapshot at the save; size, background
# write time and rate when it is committed).
saved_sync() {
  logged "$1" "checkpoint step $HALF: $NUM GB in $NUM s \($NUM GB/s\), step loop stalled $NUM s \(synchronous"
}
saved_async() {
  logged "$1" "checkpoint step $HALF: step loop stalled $NUM s \(snapshot of $NUM GB to host $NUM s\), writing in"
  logged "$1" "checkpoint step $HALF: $NUM GB in $NUM s \($NUM GB/s\) written in the background, step loop stalled"
}
# exact NAME REF: the same N step:loss strings.
exact() {
  [[ $(step_losses "$TMP/$1/metrics.jsonl" | wc -l) -eq $N ]] || fail "$1: not $N metrics lines"
  diff <(step_losses "$TMP/$2/metrics.jsonl") <(step_losses "$TMP/$1/metrics.jsonl") ||
    fail "$1: losses differ from $2 (above)"
  echo "$1: $N losses identical to $2"
}
# close NAME REF: steps 1..N each once in NAME, within 1e-5 relative of REF.
close() {
  awk -v steps=$N -v what="$1" '
    function val(line, key,   m) { if (match(line, "\"" key "\":[-0-9.eE+]+")) { m = substr(line, RSTART, RLENGTH);
                                   sub(/^[^:]*:/, "", m); return m + 0 } return "" }
    FNR == 1 { file++ }
    { s = val($0, "step"); l = val($0, "loss"); if (file == 1) ref[s] = l; else { got[s] = l; seen[s]++ } }
    END {
      bad = 0
      for (s = 1; s <= steps; s++) {
        if (!(s in ref) || seen[s] != 1) { printf "%s: step %d logged %d times\n", what, s, seen[s]; bad = 1; continue }
        d = got[s] - ref[s]; if (d < 0) d = -d
        if (d > 1e-5 * ref[s]) { printf "%s: step %d: %.9f, reference %.9f\n", what, s, got[s], ref[s]; bad = 1 }
      }
      exit bad
    }' "$TMP/$2/metrics.jsonl" "$TMP/$1/metrics.jsonl" || fail "$1: losses differ from $2"
  echo "$1: $N losses within 1e-5 of $2"
}
# resume_from SRC NAME: NAME continues from SRC's step_HALF checkpoint and metrics (copies, so SRC stays put).
resume_from() {
  cp -r "$TMP/${1}_ckpt" "$TMP/${2}_ckpt" && mkdir -p "$TMP/$2" && cp "$TMP/$1/metrics.jsonl" "$TMP/$2/" ||
    fail "copying $1"
}

# a. Exact resume, EP=2 and DP=2 on 2 ranks. The stopped runs' checkpoints are also the reshard sources.
for layout in "ep2 1 2 sync" "dp2 2 1 async" "ep2rb 1 2 sync parallelism.ep_rebalance_interval=1"; do
  read -r name dp ep mode extra <<<"$layout"
  train "${name}_ref" "$dp" "$ep" $N $extra
  train "${name}_stop" "$dp" "$ep" $HALF $(ckpt "$TMP/${name}_stop_ckpt") checkpoint.async_save=$([[ $mode == async ]] && echo true || echo false) $extra
  [[ -f $TMP/${name}_stop_ckpt/step_$HALF/manifest.json ]] || fail "${name}_stop: no step_$HALF checkpoint"
  "saved_$mode" "${name}_stop"
  resume_from "${name}_stop" "${name}_resume"
  train "${name}_resume" "$dp" "$ep" $N $(ckpt "$TMP/${name}_resume_ckpt") $extra
  [[ -z $extra ]] || logged "${name}_resume" "EP rebalance after step [0-9]+: [0-9]+ experts re-placed"
  resumed_at "${name}_resume" "$TMP/${name}_resume_ckpt"
  exact "${name}_resume" "${name}_ref"
done

# b. Reshard from EP=2: to EP=1 on 1 rank, to DP=2, to DP=2 x EP=2 (+ the final HF export).
resume_from ep2_stop ep1_from_ep2
train ep1_from_ep2 1 1 $N $(ckpt "$TMP/ep1_from_ep2_ckpt") checkpoint.save_final_model=true
resumed_at ep1_from_ep2 "$TMP/ep1_from_ep2_ckpt"
logged ep1_from_ep2 "resharded: saved on 2 ranks \(dp 1, ep 2\), resumed on 1 ranks \(dp 1, ep 1\)"
close ep1_from_ep2 ep2_ref
resume_from ep2_stop dp2_from_ep2
train dp2_from_ep2 2 1 $N $(ckpt "$TMP/dp2_from_ep2_ckpt")
resumed_at dp2_from_ep2 "$TMP/dp2_from_ep2_ckpt"
close dp2_from_ep2 ep2_ref
resume_from ep2_stop dp2ep2_from_ep2
train dp2ep2_from_ep2 2 2 $N $(ckpt "$TMP/dp2ep2_from_ep2_ckpt") checkpoint.save_final_model=true
resumed_at dp2ep2_from_ep2 "$TMP/dp2ep2_from_ep2_ckpt"
close dp2ep2_from_ep2 ep2_ref
# The 4-rank HF export holds the same tensors (header byte for byte, same size) as the 1-rank one.
one=$(cat "$TMP"/ep1_from_ep2_ckpt/final_model/*.safetensors | wc -c)
got=$(cat "$TMP"/dp2ep2_from_ep2_ckpt/final_model/*.safetensors 2>/dev/null | wc -c)
[[ $one -gt 0 && $got -eq $one ]] || fail "dp2 x ep2 final model has $got bytes, one rank's $one"
for f in "$TMP"/ep1_from_ep2_ckpt/final_model/*.safetensors; do
  g="$TMP/dp2ep2_from_ep2_ckpt/final_model/${f##*/}"
  len=$(od -An -t u8 -N 8 "$f" | tr -d ' ')
  cmp -s <(head -c $((8 + len)) "$f") <(head -c $((8 + len)) "$g") || fail "dp2 x ep2 final model: ${f##*/} header differs"
done
echo "dp2ep2_from_ep2: final model: same tensors and size ($got bytes) as one rank's"

# The reverse: saved at EP=1 on 1 rank, resumed at EP=2 on 2 ranks.
train ep1_stop 1 1 $HALF $(ckpt "$TMP/ep1_stop_ckpt") checkpoint.async_save=true
saved_async ep1_stop
resume_from ep1_stop ep2_from_ep1
train ep2_from_ep1 1 2 $N $(ckpt "$TMP/ep2_from_ep1_ckpt")
resumed_at ep2_from_ep1 "$TMP/ep2_from_ep1_ckpt"
close ep2_from_ep1 ep2_ref
echo PASS
