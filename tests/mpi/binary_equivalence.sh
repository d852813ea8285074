#!/usr/bin/env bash
# The mxtrain binary under mpirun: `mpirun -np 2 mxtrain ... parallelism.ep_size=2` (and dp_size=2) log the same
# per-step losses (metrics.jsonl, 1e-5 relative) as one process with grad_acc_steps=2, i.e. the same global
# batch, also with recompute_experts=true under EP=2; save_final_model writes a final model of the same size (under EP=2 rank 0 gathers the experts);
# a too small parallelism.ep_capacity_factor fails cleanly.
# Usage: binary_equivalence.sh MXTRAIN_BINARY
set -uo pipefail
BIN=$1
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
STEPS=6

"$BIN" --config-name L0_sanity "${TINY[@]}" parallelism.ep_size=1 grad_acc_steps=2 num_train_steps=$STEPS \
  output_dir="$TMP/one" checkpoint.ckpt_dir="$TMP/one_ckpt" checkpoint.save_final_model=true \
  checkpoint.save_every_n_steps=0 >"$TMP/one.log" 2>&1 || { cat "$TMP/one.log"; fail "one rank failed"; }
# eprc: EP=2 with the experts' activations recomputed in the backward (same losses).
# dpov: DP=2 with each layer's gradients reduced during the last backward (parallelism.overlap_grad_reduce).
for layout in "ep 1 2" "dp 2 1" "eprc 1 2 recompute_experts=true" "dpov 2 1 parallelism.overlap_grad_reduce=true"; do
  read -r name dp ep extra <<<"$layout"
  # shellcheck disable=SC2086  # $extra: zero or one override
  timeout 120 "${MPIRUN[@]}" -np 2 "$BIN" --config-name L0_sanity "${TINY[@]}" parallelism.dp_size="$dp" \
    parallelism.ep_size="$ep" $extra grad_acc_steps=1 num_train_steps=$STEPS output_dir="$TMP/$name" \
    checkpoint.ckpt_dir="$TMP/${name}_ckpt" checkpoint.save_final_model=true checkpoint.save_every_n_steps=0 \
    >"$TMP/$name.log" 2>&1 || { cat "$TMP/$name.log"; fail "mpirun -np 2 ($name=2) failed"; }
  # step -> loss from each metrics file; every step must be there and agree.
  awk -v steps=$STEPS -v what="$name=2" '
    function val(line, key,   m) { if (match(line, "\"" key "\":[-0-9.eE+]+")) { m = substr(line, RSTART, RLENGTH);
                                   sub(/^[^:]*:/, "", m); return m + 0 } return "" }
    FNR == 1 { file++ }
    { s = val($0, "step"); l = val($0, "loss"); if (file == 1) ref[s] = l; else got[s] = l }
    END {
      bad = 0
      for (s = 1; s <= steps; s++) {
        if (!(s in ref) || !(s in got)) { printf "step %d missing\n", s; bad = 1; continue }
        d = got[s] - ref[s]; if (d < 0) d = -d
        printf "step %d: one rank %.9f, %s %.9f\n", s, ref[s], what, got[s]
        if (d > 1e-5 * ref[s]) { printf "  differs by %.3g relative\n", d / ref[s]; bad = 1 }
      }
      exit bad
    }' "$TMP/one/metrics.jsonl" "$TMP/$name/metrics.jsonl" || fail "$name=2 losses differ from one rank"
  # Under EP, rank 0 logs every rank's exchange statistics at the end (steps after the first).
  if [[ $name == ep ]]; then
    for r in 0 1; do
      grep -q "EP exchanges (after the first step), world rank $r: $(((STEPS - 1) * 2)) layers x micro-batches" \
        "$TMP/$name.log" ||
        { cat "$TMP/$name.log"; fail "no EP exchange statistics for rank $r"; }
    done
    # The busiest rank's rows can only be at or above the mean rank's.
    factor=$(sed -n 's/.*EP load: .* critical path is \([0-9.]*\)x a balanced one.*/\1/p' "$TMP/$name.log")
    awk -v f="$factor" 'BEGIN { exit !(f != "" && f >= 1.0) }' || { cat "$TMP/$name.log"; fail "EP load line: '$factor'"; }
  fi
  # The final HF export: the same tensors as one rank's (its values are checked by mxtrain_mpi_check).
  one=$(cat "$TMP"/one_ckpt/final_model/*.safetensors | wc -c)
  got=$(cat "$TMP/${name}_ckpt"/final_model/*.safetensors 2>/dev/null | wc -c)
  [[ "$got" -eq "$one" ]] || fail "$name=2: final model has $got bytes, one rank's $one"
done
# A receive capacity too small for the routing ends the job with the key named, never a hang or a silent drop.
timeout 120 "${MPIRUN[@]}" -np 2 "$BIN" --config-name L0_sanity "${TINY[@]}" parallelism.ep_size=2 \
  parallelism.ep_capacity_factor=0.5 num_train_steps=2 output_dir="$TMP/cap" >"$TMP/cap.log" 2>&1
rc=$?
[[ $rc -ne 0 && $rc -ne 124 ]] || { cat "$TMP/cap.log"; fail "capacity overflow: exit status $rc"; }
grep -q "raise parallelism.ep_capacity_factor" "$TMP/cap.log" || { cat "$TMP/cap.log"; fail "no capacity message"; }
echo PASS
