#!/usr/bin/env bash
# The README's train command: installs dependencies, builds, then trains the embedded default config
# (L0_sanity) on what this machine has:
#   GPUs (nvidia-smi -L):  one rank per GPU (mpirun -np N when N > 1);
#   no GPU:                the CPU reference backend on one rank (parallelism.ep_size=1 backend=cpu).
# Extra arguments are config overrides passed to mxtrain, e.g.
#   bash scripts/train.sh num_train_steps=20 output_dir=outputs/short
# Environment: MXTRAIN_CONFIG_NAME (default L0_sanity), MXTRAIN_CUDA (AUTO|ON|OFF, for the build),
#   MXTRAIN_SKIP_DEPS=1 / MXTRAIN_SKIP_BUILD=1 to skip those steps.
# Outputs go to outputs/ (relative to the current directory) unless output_dir=... is given; at the end the
# metrics are plotted to <output_dir>/metrics.png when matplotlib is available.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${MXTRAIN_BUILD_DIR:-$ROOT/build}
CONFIG_NAME=${MXTRAIN_CONFIG_NAME:-L0_sanity}

if [[ "${MXTRAIN_SKIP_DEPS:-0}" != 1 ]]; then bash "$ROOT/scripts/install_deps.sh"; fi
if [[ "${MXTRAIN_SKIP_BUILD:-0}" != 1 ]]; then bash "$ROOT/scripts/build.sh"; fi
BIN="$BUILD_DIR/mxtrain"
[[ -x "$BIN" ]] || { echo "train.sh: $BIN not found (build failed?)" >&2; exit 1; }

# What the user already set among the overrides (key=value, +key=value or ++key=value).
user_value() {  # user_value KEY -> prints the last value given for KEY, status 1 when absent
  local key=$1 a found=1 val=""
  for a in "${ARGS[@]}"; do
    a=${a#+}; a=${a#+}
    if [[ "$a" == "$key="* ]]; then val=${a#"$key="}; found=0; fi
  done
  [[ $found -eq 0 ]] && printf '%s\n' "$val"
  return $found
}
ARGS=("$@")
EXTRA=()

OUTPUT_DIR=$(user_value output_dir) || { OUTPUT_DIR=outputs; EXTRA+=("output_dir=$OUTPUT_DIR"); }
METRICS=$(user_value logger.metrics_file) || METRICS=""
[[ -n "$METRICS" ]] || METRICS="$OUTPUT_DIR/metrics.jsonl"

NGPU=0
if command -v nvidia-smi >/dev/null 2>&1; then
  NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
fi

export NCCL_NVLS_ENABLE=0  # see docs: NVLink multicast stays off on our GPU machines
if [[ $(id -u) -eq 0 ]]; then
  # Open MPI refuses root unless told; the variables also cover the singleton (no mpirun) case.
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

if [[ $NGPU -eq 0 ]]; then
  echo "train.sh: no GPU found: CPU backend, one rank"
  user_value parallelism.ep_size >/dev/null || EXTRA+=("parallelism.ep_size=1")
  user_value backend >/dev/null || EXTRA+=("backend=cpu")
  CMD=("$BIN" --config-name "$CONFIG_NAME" "${EXTRA[@]}" "${ARGS[@]}")
elif [[ $NGPU -eq 1 ]]; then
  echo "train.sh: 1 GPU: one rank"
  user_value parallelism.ep_size >/dev/null || EXTRA+=("parallelism.ep_size=1")
  user_value parallelism.dp_size >/dev/null || EXTRA+=("parallelism.dp_size=1")
  CMD=("$BIN" --config-name "$CONFIG_NAME" "${EXTRA[@]}" "${ARGS[@]}")
else
  # One rank per GPU. The config's EP size stays (L0_sanity: 2) unless it does not divide the GPU count
  # (then EP over all GPUs); the DP size fills the rest: dp_size x ep_size = NGPU.
  if ! EP=$(user_value parallelism.ep_size); then
    EP=$("$BIN" --config-name "$CONFIG_NAME" "${ARGS[@]}" --cfg job 2>/dev/null |
         awk '/^parallelism:/ {p = 1; next} p && /^[^ ]/ {p = 0} p && $1 == "ep_size:" {print $2}')
    [[ "$EP" =~ ^[0-9]+$ && "$EP" -ge 1 && $((NGPU % EP)) -eq 0 ]] || EP=$NGPU
    EXTRA+=("parallelism.ep_size=$EP")
  fi
  [[ "$EP" =~ ^[0-9]+$ && "$EP" -ge 1 ]] || EP=$NGPU  # a bad user value: mxtrain names it
  user_value parallelism.dp_size >/dev/null || EXTRA+=("parallelism.dp_size=$((NGPU / EP))")
  echo "train.sh: $NGPU GPUs: mpirun -np $NGPU (ep_size $EP, dp_size $((NGPU / EP)) unless set)"
  MPIRUN=(mpirun -np "$NGPU" --bind-to none -x NCCL_NVLS_ENABLE)  # unpinned: the set-up uses many threads
  [[ $(id -u) -eq 0 ]] && MPIRUN+=(--allow-run-as-root)
  CMD=("${MPIRUN[@]}" "$BIN" --config-name "$CONFIG_NAME" "${EXTRA[@]}" "${ARGS[@]}")
fi

echo "+ ${CMD[*]}"
rc=0
"${CMD[@]}" || rc=$?

# Plot whatever metrics were written, even after a failed run.
PLOT="$ROOT/scripts/plot_metrics.py"
if [[ -f "$PLOT" && -s "$METRICS" ]]; then
  for py in python3 /usr/bin/python3; do
    if command -v "$py" >/dev/null 2>&1 && "$py" -c 'import matplotlib' >/dev/null 2>&1; then
      "$py" "$PLOT" "$METRICS" -o "$OUTPUT_DIR/metrics.png" && echo "train.sh: plot: $OUTPUT_DIR/metrics.png" \
        || echo "train.sh: plotting failed (training result unaffected)" >&2
      break
    fi
  done
fi
exit $rc
