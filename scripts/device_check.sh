#!/usr/bin/env bash
# One device call: the CUDA tests against their CPU twins, the HF parity check (CUDA and CPU backends),
# L0_sanity on one GPU beside the CPU backend, and the memory plan against what was allocated.
# Runs prebuilt binaries (built on the development machine, carried in BIN_DIR). Logs go to $OUT.
#   bash scripts/device_check.sh devbin
set -uo pipefail
BIN_DIR=${1:-devbin}
OUT=${OUT:-/tmp/device_out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
nvidia-smi -L
summary=()
add() { summary+=("$(printf '| %-34s | %s |' "$1" "$2")"); }

# 1. CUDA ops vs CPU twins
"$BIN_DIR/mxtrain_tests" --gtest_filter='Cuda*:*Cuda*:*Gpu*' > "$OUT/cuda_tests.log" 2>&1
rc=$?
add "CUDA op tests vs CPU twin" "rc=$rc, $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/cuda_tests.log" | tr '\n' ' ')"
grep -E '^\[  FAILED  \]' "$OUT/cuda_tests.log" | head -20

# 2. L0_sanity: CPU backend in the background while the GPU runs
L0="--config-name L0_sanity parallelism.ep_size=1"
"$BIN_DIR/mxtrain" $L0 backend=cpu output_dir="$OUT/l0_cpu" > "$OUT/l0_cpu.log" 2>&1 &
cpu_pid=$!
"$BIN_DIR/mxtrain" $L0 backend=cuda output_dir="$OUT/l0_gpu" > "$OUT/l0_gpu.log" 2>&1
add "L0_sanity on GPU" "rc=$? $(grep -o 'step 120/120 .*' "$OUT/l0_gpu.log" | cut -c1-90)"
add "GPU memory vs plan" "$(grep -o 'peak allocated.*' "$OUT/l0_gpu.log" | tail -1)"

# 3. parity with HF transformers (fp32 reference)
python3 scripts/parity_hf.py --mxtrain "$BIN_DIR/mxtrain" --backend cuda --out /tmp/parity_cuda > "$OUT/parity_cuda.log" 2>&1
add "HF parity, CUDA backend" "rc=$? ($(grep -c '"passed": true' "$OUT/parity_cuda.log") pass, $(grep -c '"passed": false' "$OUT/parity_cuda.log") fail)"
python3 scripts/parity_hf.py --mxtrain "$BIN_DIR/mxtrain" --backend cpu --out /tmp/parity_cpu > "$OUT/parity_cpu.log" 2>&1
add "HF parity, CPU backend" "rc=$? ($(grep -c '"passed": true' "$OUT/parity_cpu.log") pass, $(grep -c '"passed": false' "$OUT/parity_cpu.log") fail)"

wait $cpu_pid
add "L0_sanity on CPU" "rc=$? $(grep -o 'step 120/120 .*' "$OUT/l0_cpu.log" | cut -c1-90)"
python3 - "$OUT/l0_gpu/metrics.jsonl" "$OUT/l0_cpu/metrics.jsonl" > "$OUT/l0_compare.txt" 2>&1 <<'PY'
import json, sys
g = [json.loads(l)["loss"] for l in open(sys.argv[1])]
c = [json.loads(l)["loss"] for l in open(sys.argv[2])]
n = min(len(g), len(c))
d = [abs(a - b) / abs(b) for a, b in zip(g[:n], c[:n])]
print(f"steps {n}: gpu {g[0]:.4f}->{g[n-1]:.4f}, cpu {c[0]:.4f}->{c[n-1]:.4f}, "
      f"max rel diff first 10 steps {max(d[:10]):.2e}, mean rel diff all {sum(d)/n:.2e}")
PY
add "L0 loss curve GPU vs CPU" "$(cat "$OUT/l0_compare.txt")"

echo
echo "| check | result |"
echo "|---|---|"
printf '%s\n' "${summary[@]}"
grep -h '^|' "$OUT/parity_cuda.log" "$OUT/parity_cpu.log" 2>/dev/null
