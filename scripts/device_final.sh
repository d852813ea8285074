#!/usr/bin/env bash
# One device call after a round of kernel work: CUDA tests vs CPU twins, kernel benchmarks beside cuBLASLt /
# PyTorch, the HF parity check and the 8x1B trainer benchmark beside the HF baseline. Each part is time-boxed;
# logs go to $OUT; a short table is printed last.
#   bash scripts/device_final.sh devbin
set -uo pipefail
BIN=${1:-devbin}
OUT=${OUT:-/tmp/device_out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
rows=()
row() { rows+=("| $1 | $2 |"); }

timeout 150 "$BIN/mxtrain_tests" --gtest_filter='*Cuda*:*Gpu*:*Mxfp8*' > "$OUT/cuda_tests.log" 2>&1
row "CUDA tests vs CPU twins (rc $?)" "$(grep -E '^\[  (PASSED|FAILED) ' "$OUT/cuda_tests.log" | tr '\n' ' ')"
grep -E '^\[  FAILED  \]' "$OUT/cuda_tests.log" | sort -u | head -30

# L0_sanity EP=2 on 2 GPUs against one GPU with the same global batch (20 steps), where 2 GPUs are present.
if [ "$(nvidia-smi -L | grep -c '^GPU')" -ge 2 ]; then
  timeout 60 mpirun --allow-run-as-root -np 2 -x NCCL_NVLS_ENABLE "$BIN/mxtrain" --config-name L0_sanity \
    num_train_steps=20 output_dir="$OUT/l0_ep2" > "$OUT/l0_ep2.log" 2>&1
  rc2=$?
  timeout 40 "$BIN/mxtrain" --config-name L0_sanity parallelism.ep_size=1 grad_acc_steps=2 num_train_steps=20 \
    output_dir="$OUT/l0_ep1" > "$OUT/l0_ep1.log" 2>&1
  rc1=$?
  cmp=$(python3 -c "
import json,sys
a=[json.loads(l)['loss'] for l in open('$OUT/l0_ep2/metrics.jsonl')]
b=[json.loads(l)['loss'] for l in open('$OUT/l0_ep1/metrics.jsonl')]
print('steps %d, EP=2 %.4f->%.4f, 1 GPU %.4f->%.4f, max rel diff %.2e' % (len(a), a[0], a[-1], b[0], b[-1], max(abs(x-y)/abs(y) for x,y in zip(a,b))))" 2>&1 | tail -1)
  row "L0_sanity EP=2 (2 GPUs) vs 1 GPU (rc $rc2/$rc1)" "$cmp"
fi

if [ -x "$BIN/bench_grouped_gemm" ]; then
  timeout 90 "$BIN/bench_grouped_gemm" > "$OUT/bench_grouped_gemm.log" 2>&1
  row "grouped GEMM bench (rc $?)" "see table below"
fi
if [ -x "$BIN/bench_attention" ]; then
  timeout 50 "$BIN/bench_attention" > "$OUT/bench_attention.log" 2>&1
  row "attention bench (rc $?)" "see table below"
  timeout 50 python3 scripts/bench_attention_torch.py > "$OUT/bench_attention_torch.log" 2>&1
  row "PyTorch SDPA bench (rc $?)" "see table below"
fi
timeout 170 python3 scripts/bench_trainer.py --mxtrain "$BIN/mxtrain" --hf-baseline "$BIN/hf_baseline.py" \
  --out "$OUT/bench" 8x1B > "$OUT/bench_trainer.log" 2>&1
row "8x1B trainer vs HF (rc $?)" "$(grep '^| 8x1B' "$OUT/bench_trainer.log")"

echo
printf '%s\n' "| part | result |" "|---|---|" "${rows[@]}"
echo; grep -h '^|' "$OUT/bench_grouped_gemm.log" 2>/dev/null | head -30
echo; grep -h '^|' "$OUT/bench_attention.log" "$OUT/bench_attention_torch.log" 2>/dev/null | head -24
