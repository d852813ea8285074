#!/usr/bin/env bash
# Kill test for checkpoints: SIGKILL the trainer at random moments (most of its time goes to saving: a
# checkpoint every step, sync or async at random), many times. After every kill the next run must resume from
# the newest complete checkpoint; at the end, the run finishes and its metrics (one line per step, losses
# bit for bit) equal those of a run that was never interrupted.
#
#   scripts/kill_test.sh [path/to/mxtrain] [kills, default 20]
set -euo pipefail

BIN=${1:-build/mxtrain}
KILLS=${2:-20}
STEPS=40
WORK=$(mktemp -d /tmp/mxtrain_kill_test.XXXXXX)
pid=""
cleanup() {
  local rc=$?
  if [[ -n $pid ]]; then kill -9 "$pid" 2>/dev/null || true; fi
  wait 2>/dev/null || true
  rm -rf "$WORK"
  exit $rc
}
trap cleanup EXIT

ARGS=(--config-name L0_sanity parallelism.ep_size=1 backend=cpu config_kwargs.vocab_size=256
      config_kwargs.hidden_size=64 config_kwargs.intermediate_size=128 config_kwargs.num_attention_heads=4
      config_kwargs.num_key_value_heads=2 config_kwargs.router_jitter_noise=0.05 dataset.max_seq_length=32
      dataset.stride=8 num_train_steps=$STEPS logger.frequency=1 checkpoint.save_final_model=false)

fail() { echo "kill_test: FAIL: $*" >&2; exit 1; }

# step:loss pairs of a metrics file, in file order.
step_losses() { grep -o '"step":[0-9]*,"total_steps":[0-9]*,"loss":[^,]*' "$1" | sed 's/,"total_steps":[0-9]*//'; }

# Newest step_<N> holding a manifest (the definition of complete), or empty.
newest_complete() {
  local best=""
  for m in "$WORK"/ckpt/step_*/manifest.json; do
    [[ -e $m ]] || continue
    local n=${m%/manifest.json}; n=${n##*/step_}
    [[ $n =~ ^[0-9]+$ ]] || continue  # step_<N>.tmp holds a manifest just before its rename: not complete
    [[ -z $best || $n -gt $best ]] && best=$n
  done
  echo "$best"
}

"$BIN" "${ARGS[@]}" output_dir="$WORK/reference" > "$WORK/reference.log" 2>&1 || fail "reference run failed: $(tail -5 "$WORK/reference.log")"

RUN=("$BIN" "${ARGS[@]}" output_dir="$WORK/out" checkpoint.ckpt_dir="$WORK/ckpt" checkpoint.save_every_n_steps=1
     checkpoint.max_checkpoints=3)
mid_save=0
resumed=0
for ((i = 1; i <= KILLS; i++)); do
  expect=$(newest_complete)
  async=$((RANDOM % 2 == 0 ? 1 : 0))
  log="$WORK/run_$i.log"
  : > "$log"
  "${RUN[@]}" checkpoint.async_save=$([[ $async == 1 ]] && echo true || echo false) > "$log" 2>&1 &
  pid=$!
  # Wait until it has resumed (or started fresh) and begun training, then kill it at a random moment.
  for ((t = 0; t < 200; t++)); do
    grep -q "training $STEPS steps" "$log" && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.02
  done
  grep -q "training $STEPS steps" "$log" || fail "run $i did not start training: $(tail -5 "$log")"
  if [[ -n $expect ]]; then
    grep -q "resumed from checkpoint $WORK/ckpt/step_$expect at step $expect" "$log" ||
      fail "run $i did not resume from the newest complete checkpoint step_$expect: $(grep -E 'resumed|checkpoint|error' "$log" | tail -5)"
    resumed=$((resumed + 1))
  elif grep -q "resumed from" "$log"; then
    fail "run $i resumed although no complete checkpoint existed"
  fi
  sleep "$(printf '0.%03d' $((RANDOM % 400)))"
  kill -9 $pid 2>/dev/null || true
  wait $pid 2>/dev/null || true
  # A save directory or a removal (retention) in progress: the kill landed inside a save.
  if compgen -G "$WORK/ckpt/step_*.tmp" > /dev/null || compgen -G "$WORK/ckpt/step_*.trash" > /dev/null; then
    mid_save=$((mid_save + 1))
  fi
  if grep -q "training $STEPS steps" "$log" && grep -qE "^\S+ \S+ \[(error|critical)\]" "$log"; then
    fail "run $i logged an error: $(grep -E '\[(error|critical)\]' "$log" | head -3)"
  fi
done

# Finish the run without interruption.
expect=$(newest_complete)
"${RUN[@]}" > "$WORK/final.log" 2>&1 || fail "the final run failed: $(tail -5 "$WORK/final.log")"
[[ -z $expect ]] || grep -q "resumed from checkpoint $WORK/ckpt/step_$expect at step $expect" "$WORK/final.log" ||
  fail "the final run did not resume from step_$expect"
[[ $(find "$WORK/ckpt" -maxdepth 1 -name 'step_*' | wc -l) -le 3 ]] || fail "more than max_checkpoints=3 left"

diff <(step_losses "$WORK/reference/metrics.jsonl") <(step_losses "$WORK/out/metrics.jsonl") > "$WORK/diff.txt" ||
  fail "losses differ from the uninterrupted run: $(head -10 "$WORK/diff.txt")"
n=$(step_losses "$WORK/out/metrics.jsonl" | wc -l)
[[ $n == "$STEPS" ]] || fail "$n metrics lines, expected $STEPS"
echo "kill_test: OK: $KILLS kills ($mid_save left a save in progress), $resumed resumes from the newest complete" \
     "checkpoint, $STEPS steps identical to the uninterrupted run"
(( mid_save > 0 )) || echo "kill_test: warning: no kill landed during a save this time"
