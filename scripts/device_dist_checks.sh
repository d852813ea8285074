#!/usr/bin/env bash
# Device checks for the distributed, checkpoint and full-shape issues, on a 2-GPU machine, with prebuilt
# binaries (built on the development machine, carried in BIN_DIR). Each section is named on the command line;
# logs go to $OUT; a short table is printed at the end.
#   bash scripts/device_dist_checks.sh devbin ep8x1b kill resume ckpt8x1b ep8x7b
# Sections:
#   attn      attention kernels: the CUDA tests against the reference, bench_attention beside PyTorch SDPA
#   ep8x1b    8x1B (seq 4096, mbs 1): 1 GPU with grad_acc 16 vs EP=2 on 2 GPUs with grad_acc 8 (the same global
#             batch), 5 steps: losses side by side, tokens/s per GPU, NCCL time (MXTRAIN_COMM_TIMING=1)
#   kill      L0_sanity EP=2 on 2 GPUs, rank 1 SIGKILLed mid-run: the job ends with a message naming it
#   resume2   L0_sanity EP=2 on 2 GPUs: determinism, 10 steps + resume for 10, the final HF export
#   resume    L0_sanity on 1 GPU: two straight 20-step runs (determinism), then 10 steps + resume for 10
#   ckpt8x1b  8x1B on 1 GPU: async save at step 2, then resume from it: save, stall and load times
#   profile8x1b  8x1B on 1 GPU, one micro-batch and one optimizer step under ncu (kernel durations only): GPU
#             time per kernel family, the top of the list printed
#   ggncu     ncu on bench_grouped_gemm's 8x7B forwards: our kernels beside cuBLASLt's dense GEMM (clock, duration,
#             SpeedOfLight and memory throughputs per kernel name; written in session 29, not yet run)
#   wgncu     ncu --set full on the single-call W13 weight gradient (one CTA, pairs over m, each with and without its
#             epilogue) beside cuBLASLt's dense GEMM: cycles, tensor pipe, L2 and DRAM traffic (scripts/ncu_table.py)
#   wgncu16   ncu --set full on the single-call W13 and W2 weight gradients storing a bf16 dW (pairs over m, with and
#             without the epilogue) beside cuBLASLt's dense GEMM storing bf16, each launch picked by its NVTX range
#   epiprobe  bench_wgrad_epilogue: the wgrad's fp32 epilogue alone (no mainloop), every way of writing the tile
#             (TMA add / store with 64x16 or 64x32 boxes, 1-12 in flight; red.global, st.global), with and without a
#             mainloop-long spin per tile, on all and half the SMs, beside a stand-in for the mainloop's operand
#             loads, and beside a memset of the same bytes
#   cuda      every CUDA test (bf16 and MXFP8 kernels, GPU training) against its CPU twin
#   parity    scripts/parity_hf.py, CUDA backend (bf16, then cuda-fp32), against HF transformers in fp32
#   trainer   scripts/bench_trainer.py: L0_sanity (1 GPU) and the 8x7B 2-layer shape beside the HF baseline
#   study     scripts/router_precision_study.py: which bf16 roundings move the router-gate gradients
#   mxgpu     the MXFP8 CUDA tests (quantisers, GEMMs, expert MLP, dense linear, a short fp8 training run) vs CPU twins
#   conv      convergence, bf16 (GPU 0) beside MXFP8 (GPU 1; on a one-GPU machine one after the other) on the same
#             data: L0_sanity 300 steps, then 8x1B (seq 4096, mbs 1, acc 1, lr 3e-4) 300 steps
#   fp8speed  8x1B (seq 4096, mbs 1, acc 8): bf16, MXFP8 with the bf16 GEMMs (fp8_config.hopper_gemm=bf16, the
#             default) and with the FP8 kernels (hopper_gemm=fp8), and the HF baseline (shared/bench/hf_baseline.py
#             copied into BIN_DIR), one after the other: tokens/s and peak memory
#   epover    8x1B (seq 4096, mbs 1, acc 8, 6 steps), stage timing on (MXTRAIN_STAGE_TIMING=1): 1 GPU, then EP=2 on 2
#             GPUs with the backward combine overlapped (parallelism.ep_overlap), overlapped with 16 SMs left to
#             NCCL (MXTRAIN_OVERLAP_SMS=16), and not overlapped: tokens/s per GPU and where each rank's GPU time goes
#   dpov      8x1B (seq 4096, mbs 1, acc 8, 6 steps), DP=2 on 2 GPUs, gradients reduced after the backward vs during
#             it (parallelism.overlap_grad_reduce): losses side by side, tokens/s, stage and NCCL timing
#   ov8x7b    8x7B layer shapes, 2 layers, EP=2, MXFP8, 4 steps of acc 8: the backward overlap on (0 and 16 SMs left
#             to NCCL) and off: tokens/s and the overlapped exchange's time
#   power     bench_grouped_gemm --sustain: the 8x7B W13 GEMMs held 5 s each (cuBLASLt dense, 1-CTA, CTA pairs) with
#             nvidia-smi sampling: TFLOP/s, SM clock and power of each under the 700 W cap (scripts/gpu_samples.py run)
#   stages    bench_8x1B and bench_8x7B_2layer (4 steps, eager) with MXTRAIN_STAGE_TIMING=1: GPU time per stage and
#             sub-stage (projections, RoPE, attention core, router, permutes, expert wgrad) per optimizer step
#             (a whole-run ncu profile of these shapes does not finish in a device call's 10 minutes; session 26)
#   ab        trainer A/B: AB_A and AB_B ("DIR [VAR=value ...]"), alternating A B A B on bench_8x1B and
#             bench_8x7B_2layer (AB_CFGS), 8 steps: tok/s timed as the HF baseline does, losses compared
#   ops       bench_8x1B and bench_8x7B_2layer (3 steps, eager) with MXTRAIN_STAGE_TIMING=ops: the stage table and
#             GPU time per kernel launch by (innermost stage, op), the 45 longest printed
#   speed     issue 4's single-GPU figures in one call: bench_attention (8x1B, 8x7B shapes) beside PyTorch's SDPA,
#             bench_grouped_gemm beside cuBLASLt, scripts/bench_trainer.py (8x1B, 8x7B 2 layers, L0_sanity) beside HF,
#             with the GPU's clock and power per run (--sample-gpu)
#   optim     the optimizer step alone (scripts/bench_optimizer_torch.py): HF's model at the 8x7B 2-layer shape with
#             hf_baseline.py's update (bf16, fused AdamW, no clipping) beside fp32 parameters and moments with and
#             without clip_grad_norm_ (the recipe's numerics, in PyTorch); then mxtrain's op table for the same shape
#             (its adamw_step and sum_squares rows), in the same call
#   rate      the tensor pipe per wgmma issue pattern (bench_wgmma_rate; its CUDA test first)
#   epnccl    8x1B (seq 4096, mbs 1, acc 8, 6 steps): 1 GPU, then EP=2 on 2 GPUs with NCCL's defaults and with
#             NCCL_CTA_POLICY=2 (zero-CTA where NCCL can), with the backward combine overlapped and no SMs left to
#             NCCL (tokens/s per GPU, NCCL time). Session 18: no change; NCCL_P2P_USE_CUDA_MEMCPY=1 (copy-engine
#             p2p) hung the first exchange, so it is not run
#   epbalance 8x1B (seq 4096, mbs 1, acc 8, 6 steps): 1 GPU and EP=2 with router_force_load_balancing=true
#             (every expert gets the same rows): the scaling without the router's imbalance (tokens/s per GPU,
#             NCCL time, EP load)
#   eprebalance 8x1B (seq 4096, mbs 1, acc 8, 40 steps, warm-up 5) on $DATA (BENCH_DATA=embedded for the real-data
#             figure of docs/perf.md): 1 GPU, EP=2 with the router's own placement and EP=2 with
#             parallelism.ep_rebalance_interval=1 (experts re-placed after every step), same call; and the
#             GPU-rank equivalence check with re-placement and the trainer's self-check (MXTRAIN_CHECK_REBALANCE), at
#             lr 3e-4: at the tiny model's 3e-3 its weights part by ~lr per step once relabelling changes the
#             router's summation order (docs/perf.md), beyond the bf16 tolerance
#   ep8x7b    8x7B layer shapes, 8 layers (6 if 8 do not fit), EP=2 on 2 GPUs, MXFP8 then bf16: memory plan vs
#             measured peak, tokens/s per GPU, NCCL time and stage times (L1_8x7B_ep's settings, so since 4ad8b99
#             with recompute_experts and per-layer columnwise weight copies)
set -uo pipefail
BIN_DIR=${1:?usage: device_dist_checks.sh BIN_DIR section...}
shift
OUT=${OUT:-/tmp/device_out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
MX=$BIN_DIR/mxtrain
# The 8x1B throughput runs read uniform random ids, as the HF baseline does (BENCH_DATA=embedded: the byte-level
# corpus of the rows in docs/perf.md before session 15, whose skewed tokens unbalance the experts).
DATA="dataset.source=${BENCH_DATA:-random}"
# --bind-to none: Open MPI pins each of 2 ranks to one core by default, which serialises the parameter init threads
# (4 minutes instead of seconds for the 8x7B layers).
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --bind-to none -x NCCL_NVLS_ENABLE -x MXTRAIN_COMM_TIMING)
summary=()
add() { summary+=("$(printf '| %-28s | %s |' "$1" "$2")"); }
# The commit the binaries were built from, so a log names the code it measured (session 28 measured a stale pack).
add "binary" "$("$MX" --version 2>&1 | head -1)"
# loss/tokens_per_s summary of metrics files: label=file ...
metrics() {
  python3 - "$@" <<'PY'
import json, sys
runs = {}
for arg in sys.argv[1:]:
    name, path = arg.split("=", 1)
    try:
        runs[name] = [json.loads(l) for l in open(path)]
    except OSError as e:
        print(f"{name}: {e}")
for name, rows in runs.items():
    tps = sorted(r.get("tokens_per_s", 0) for r in rows[1:]) or [0]
    print(f"{name}: steps {len(rows)}, loss " + " ".join(f"{r['loss']:.5f}" for r in rows) +
          f", median tok/s after step 1 {tps[len(tps) // 2]:.0f}")
names = list(runs)
if len(names) >= 2:
    a, b = runs[names[0]], runs[names[1]]
    n = min(len(a), len(b))
    if n:
        d = max(abs(x["loss"] - y["loss"]) / abs(x["loss"]) for x, y in zip(a[:n], b[:n]))
        same = all(x["loss"] == y["loss"] for x, y in zip(a[:n], b[:n]))
        print(f"{names[0]} vs {names[1]}: max rel loss diff {d:.3e} over {n} steps, bit-identical {same}")
PY
}

# Nsight Compute: on the PATH, else where the device image installs it (empty where neither has it).
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)

# tokens/s over steps 2.. of a metrics file, as hf_baseline.py times it
tok_per_s() {
  python3 - "$1" <<'PY' 2>&1 | tail -1
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])]
print("%.0f tok/s" % ((r[-1]["tokens"] - r[1]["tokens"]) / (r[-1]["elapsed_s"] - r[1]["elapsed_s"])))
PY
}

for section in "$@"; do
  case $section in
  attn)
    CUDA_VISIBLE_DEVICES=0 timeout 300 "$BIN_DIR/mxtrain_tests" --gtest_filter='CudaAttention*' >"$OUT/attn_tests.log" 2>&1
    add "CUDA attention tests" "rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/attn_tests.log" | tr '\n' ' ')"
    grep -E '^\[  FAILED  \]' "$OUT/attn_tests.log" | head
    CUDA_VISIBLE_DEVICES=0 timeout 300 "$BIN_DIR/bench_attention" --shape all >"$OUT/bench_attention.log" 2>&1
    add "bench_attention" "rc=$?"
    CUDA_VISIBLE_DEVICES=0 timeout 200 python3 scripts/bench_attention_torch.py >"$OUT/bench_attention_torch.log" 2>&1
    add "torch SDPA bench" "rc=$?"
    cat "$OUT/bench_attention.log" "$OUT/bench_attention_torch.log" | grep -v '^\s*$' | tail -60
    ;;
  ep8x1b)
    B8="--config-name bench_8x1B backend=cuda num_train_steps=5 lr_scheduler_kwargs.num_decay_steps=4 $DATA"
    CUDA_VISIBLE_DEVICES=0 MXTRAIN_COMM_TIMING=1 timeout 300 "$MX" $B8 grad_acc_steps=16 output_dir="$OUT/8x1b_1gpu" \
      >"$OUT/8x1b_1gpu.log" 2>&1
    add "8x1B 1 GPU acc16" "rc=$?"
    MXTRAIN_COMM_TIMING=1 timeout 300 "${MPIRUN[@]}" -np 2 "$MX" $B8 parallelism.ep_size=2 grad_acc_steps=8 \
      output_dir="$OUT/8x1b_ep2" >"$OUT/8x1b_ep2.log" 2>&1
    add "8x1B EP=2 2 GPUs acc8" "rc=$?"
    metrics one_gpu="$OUT/8x1b_1gpu/metrics.jsonl" ep2="$OUT/8x1b_ep2/metrics.jsonl" | tee "$OUT/8x1b_cmp.txt"
    grep -h "comm timing\|peak allocated\|EP exchanges" "$OUT/8x1b_ep2.log" | tee -a "$OUT/8x1b_cmp.txt"
    add "8x1B EP=2 vs 1 GPU" "$(tail -n +3 "$OUT/8x1b_cmp.txt" | head -1)"
    ;;
  epnccl)
    B8="--config-name bench_8x1B backend=cuda num_train_steps=6 grad_acc_steps=8 lr_scheduler_kwargs.num_decay_steps=5 $DATA"
    CUDA_VISIBLE_DEVICES=0 timeout 300 "$MX" $B8 output_dir="$OUT/nc_1gpu" >"$OUT/nc_1gpu.log" 2>&1
    add "8x1B 1 GPU acc8" "rc=$?"
    runs=(one_gpu="$OUT/nc_1gpu/metrics.jsonl")
    for v in default NCCL_CTA_POLICY=2; do
      tag=${v%%=*}
      env_args=()
      [[ $v == *=* ]] && env_args=(-x "$v")
      MXTRAIN_OVERLAP_SMS=0 MXTRAIN_COMM_TIMING=1 timeout 300 "${MPIRUN[@]}" -x MXTRAIN_OVERLAP_SMS "${env_args[@]}" \
        -np 2 "$MX" $B8 parallelism.ep_size=2 parallelism.ep_overlap=true output_dir="$OUT/nc_$tag" \
        >"$OUT/nc_$tag.log" 2>&1
      add "8x1B EP=2 overlap, $v" "rc=$?"
      runs+=("$tag=$OUT/nc_$tag/metrics.jsonl")
      grep -h "comm timing, ep group" "$OUT/nc_$tag.log" | sed 's/^.*\] //' | cut -c1-170 | head -2
    done
    metrics "${runs[@]}" | tee "$OUT/nc_cmp.txt"
    ;;
  epbalance)
    B8="--config-name bench_8x1B backend=cuda num_train_steps=6 grad_acc_steps=8 lr_scheduler_kwargs.num_decay_steps=5 $DATA router_force_load_balancing=true"
    CUDA_VISIBLE_DEVICES=0 timeout 300 "$MX" $B8 output_dir="$OUT/bal_1gpu" >"$OUT/bal_1gpu.log" 2>&1
    add "8x1B 1 GPU, forced balance" "rc=$?"
    MXTRAIN_COMM_TIMING=1 timeout 300 "${MPIRUN[@]}" -np 2 "$MX" $B8 parallelism.ep_size=2 output_dir="$OUT/bal_ep2" \
      >"$OUT/bal_ep2.log" 2>&1
    add "8x1B EP=2, forced balance" "rc=$?"
    grep -h "EP load\|comm timing, ep group" "$OUT/bal_ep2.log" | sed 's/^.*\] //' | cut -c1-200
    metrics one_gpu="$OUT/bal_1gpu/metrics.jsonl" ep2="$OUT/bal_ep2/metrics.jsonl" | tee "$OUT/bal_cmp.txt"
    ;;
  eprebalance)
    MXTRAIN_CHECK_REBALANCE=1 timeout 120 "${MPIRUN[@]}" -x MXTRAIN_CHECK_REBALANCE -np 2 "$BIN_DIR/mxtrain_mpi_check" \
      --dp 1 --ep 2 --acc 2 --rebalance 1 --lr 3e-4 --backend cuda >"$OUT/rb_mpi_check.log" 2>&1
    add "mpi_check cuda EP=2 rebalance" "rc=$?"
    B8="--config-name bench_8x1B backend=cuda num_train_steps=40 grad_acc_steps=8 lr_scheduler_kwargs.num_warmup_steps=5 lr_scheduler_kwargs.num_decay_steps=35 $DATA"
    CUDA_VISIBLE_DEVICES=0 timeout 300 "$MX" $B8 output_dir="$OUT/rb_1gpu" >"$OUT/rb_1gpu.log" 2>&1
    add "8x1B 1 GPU" "rc=$?"
    for rb in 0 1; do
      timeout 300 "${MPIRUN[@]}" -np 2 "$MX" $B8 parallelism.ep_size=2 parallelism.ep_rebalance_interval=$rb \
        output_dir="$OUT/rb_ep2_$rb" >"$OUT/rb_ep2_$rb.log" 2>&1
      add "8x1B EP=2, rebalance every $rb" "rc=$?"
      grep -h "EP load\|EP rebalance" "$OUT/rb_ep2_$rb.log" | sed 's/^.*\] //' | cut -c1-200
    done
    metrics one_gpu="$OUT/rb_1gpu/metrics.jsonl" ep2_own="$OUT/rb_ep2_0/metrics.jsonl" \
      ep2_rebalanced="$OUT/rb_ep2_1/metrics.jsonl" | tee "$OUT/rb_cmp.txt"
    ;;
  epover)
    B8="--config-name bench_8x1B backend=cuda num_train_steps=6 grad_acc_steps=8 lr_scheduler_kwargs.num_decay_steps=5 $DATA"
    CUDA_VISIBLE_DEVICES=0 MXTRAIN_STAGE_TIMING=1 timeout 300 "$MX" $B8 output_dir="$OUT/ov_1gpu" >"$OUT/ov_1gpu.log" 2>&1
    add "8x1B 1 GPU acc8 (stage timing)" "rc=$?"
    for v in on:0 on:16 off:0; do
      MXTRAIN_STAGE_TIMING=1 MXTRAIN_OVERLAP_SMS=${v#*:} MXTRAIN_COMM_TIMING=1 timeout 300 "${MPIRUN[@]}" \
        -x MXTRAIN_STAGE_TIMING -x MXTRAIN_OVERLAP_SMS -np 2 "$MX" $B8 parallelism.ep_size=2 \
        parallelism.ep_overlap=$([[ ${v%%:*} == on ]] && echo true || echo false) output_dir="$OUT/ov_${v/:/_}" \
        >"$OUT/ov_${v/:/_}.log" 2>&1
      add "8x1B EP=2 overlap ${v}" "rc=$?"
    done
    metrics one_gpu="$OUT/ov_1gpu/metrics.jsonl" ep2_on0="$OUT/ov_on_0/metrics.jsonl" | tee "$OUT/ov_cmp.txt"
    metrics ep2_on16="$OUT/ov_on_16/metrics.jsonl" ep2_off="$OUT/ov_off_0/metrics.jsonl" | tee -a "$OUT/ov_cmp.txt"
    for f in ov_1gpu ov_on_0 ov_on_16 ov_off_0; do
      echo "== $f"; grep -h -A16 "stage times" "$OUT/$f.log" | grep -v "^\s*layer\b" | head -40
      grep -h "EP exchanges\|comm timing" "$OUT/$f.log" | sed 's/^.*\] //'
    done | tee -a "$OUT/ov_cmp.txt"
    add "8x1B EP=2 overlap" "$(grep -h 'median tok/s' "$OUT/ov_cmp.txt" | sed 's/steps 6, loss.*median//' | tr '\n' ' ')"
    ;;
  kill)
    MXT_KILL_ARGS="backend=cuda logger.frequency=1" timeout 200 bash tests/mpi/kill_rank.sh "$MX" kill \
      >"$OUT/kill_gpu.log" 2>&1
    add "GPU kill rank 1 (EP=2)" "rc=$? $(grep -o 'job ended.*' "$OUT/kill_gpu.log")"
    ;;
  resume2)
    # The same on 2 GPUs, EP=2 (the dense fp32 master sharded over the ranks, the bf16 working copy all-gathered):
    # two straight runs, then 10 steps + a resume for 10 more.
    L0="--config-name L0_sanity backend=cuda logger.frequency=1 checkpoint.save_final_model=false"
    "${MPIRUN[@]}" -np 2 "$MX" $L0 num_train_steps=20 output_dir="$OUT/res2_a" >"$OUT/res2_a.log" 2>&1
    add "EP=2 L0 20 steps" "rc=$?"
    "${MPIRUN[@]}" -np 2 "$MX" $L0 num_train_steps=20 output_dir="$OUT/res2_b" >"$OUT/res2_b.log" 2>&1
    R="$L0 output_dir=$OUT/res2_c checkpoint.ckpt_dir=/tmp/res2_ckpt checkpoint.save_every_n_steps=10"
    "${MPIRUN[@]}" -np 2 "$MX" $R num_train_steps=10 >"$OUT/res2_c1.log" 2>&1
    "${MPIRUN[@]}" -np 2 "$MX" $R num_train_steps=20 checkpoint.save_final_model=true >"$OUT/res2_c2.log" 2>&1
    add "EP=2 L0 10 + resume 10, final export" "rc=$?"
    metrics straight1="$OUT/res2_a/metrics.jsonl" straight2="$OUT/res2_b/metrics.jsonl" | tail -1 | tee "$OUT/res2_cmp.txt"
    metrics straight1="$OUT/res2_a/metrics.jsonl" resumed="$OUT/res2_c/metrics.jsonl" | tail -1 | tee -a "$OUT/res2_cmp.txt"
    add "EP=2 determinism (2 runs)" "$(sed -n 1p "$OUT/res2_cmp.txt")"
    add "EP=2 resume 10+10 vs 20" "$(sed -n 2p "$OUT/res2_cmp.txt")"
    ls /tmp/res2_ckpt/final_model 2>&1 | head -3
    ;;
  resume)
    L0="--config-name L0_sanity parallelism.ep_size=1 backend=cuda logger.frequency=1 checkpoint.save_final_model=false"
    export CUDA_VISIBLE_DEVICES=0
    "$MX" $L0 num_train_steps=20 output_dir="$OUT/res_a" >"$OUT/res_a.log" 2>&1
    "$MX" $L0 num_train_steps=20 output_dir="$OUT/res_b" >"$OUT/res_b.log" 2>&1
    R="$L0 output_dir=$OUT/res_c checkpoint.ckpt_dir=/tmp/res_ckpt checkpoint.save_every_n_steps=10"
    "$MX" $R num_train_steps=10 >"$OUT/res_c1.log" 2>&1
    "$MX" $R num_train_steps=20 >"$OUT/res_c2.log" 2>&1
    unset CUDA_VISIBLE_DEVICES
    metrics straight1="$OUT/res_a/metrics.jsonl" straight2="$OUT/res_b/metrics.jsonl" | tail -1 | tee "$OUT/res_cmp.txt"
    metrics straight1="$OUT/res_a/metrics.jsonl" resumed="$OUT/res_c/metrics.jsonl" | tail -1 | tee -a "$OUT/res_cmp.txt"
    grep -h "resumed from" "$OUT/res_c2.log"
    add "GPU determinism (2 runs)" "$(sed -n 1p "$OUT/res_cmp.txt")"
    add "GPU resume 10+10 vs 20" "$(sed -n 2p "$OUT/res_cmp.txt")"
    ;;
  ckpt8x1b)
    export CUDA_VISIBLE_DEVICES=0
    C8="--config-name bench_8x1B backend=cuda grad_acc_steps=2 lr_scheduler_kwargs.num_decay_steps=4 \
        output_dir=$OUT/ck8 checkpoint.ckpt_dir=/tmp/ck8 checkpoint.save_every_n_steps=2 checkpoint.async_save=true"
    timeout 400 "$MX" $C8 num_train_steps=3 >"$OUT/ck8_save.log" 2>&1
    add "8x1B async save" "rc=$? $(grep -h 'checkpoint step' "$OUT/ck8_save.log" | sed 's/^.*\] //' | tr '\n' ' ')"
    timeout 300 "$MX" $C8 num_train_steps=4 checkpoint.save_every_n_steps=0 >"$OUT/ck8_load.log" 2>&1
    add "8x1B resume (load)" "rc=$? $(grep -h 'resumed from' "$OUT/ck8_load.log" | sed 's/^.*\] //')"
    timeout 300 "$MX" $C8 num_train_steps=4 checkpoint.ckpt_dir=null output_dir="$OUT/ck8_straight" \
      >"$OUT/ck8_straight.log" 2>&1
    add "8x1B 2+2 resume vs 4 straight" "$(metrics straight="$OUT/ck8_straight/metrics.jsonl" resumed="$OUT/ck8/metrics.jsonl" | tail -1)"
    unset CUDA_VISIBLE_DEVICES
    du -sh /tmp/ck8/* 2>/dev/null
    rm -rf /tmp/ck8
    ;;
  profile8x1b)
    CUDA_VISIBLE_DEVICES=0 timeout 300 "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv \
      --log-file "$OUT/ncu_8x1b.csv" "$MX" --config-name bench_8x1B backend=cuda num_train_steps=1 grad_acc_steps=1 \
      lr_scheduler_kwargs.num_decay_steps=1 output_dir="$OUT/prof" >"$OUT/prof.log" 2>&1
    add "ncu 8x1B profile" "rc=$?"
    python3 - "$OUT/ncu_8x1b.csv" <<'PY' | tee "$OUT/profile_8x1b.txt"
import csv, re, sys, collections
tot = collections.defaultdict(float); cnt = collections.Counter()
rows = [l for l in open(sys.argv[1]) if l.startswith('"')]
for r in csv.DictReader(rows):
    if r.get("Metric Name") != "gpu__time_duration.sum": continue
    name = r["Kernel Name"]
    key = re.sub(r"<.*", "", name.split("(")[0]).strip()
    v = float(r["Metric Value"].replace(",", ""))
    unit = r.get("Metric Unit", "ns")
    v *= {"ns": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1, "msecond": 1, "nsecond": 1e-6}.get(unit, 1e-6)
    tot[key] += v; cnt[key] += 1
s = sum(tot.values())
print(f"total GPU kernel time {s:.1f} ms over {sum(cnt.values())} kernels")
for k, v in sorted(tot.items(), key=lambda x: -x[1])[:25]:
    print(f"{v:9.2f} ms {100 * v / s:5.1f}%  x{cnt[k]:<5d} {k[:90]}")
PY
    ;;
  ggncu)
    # Our forward W13 grouped GEMM (1 CTA and CTA pairs) beside cuBLASLt's dense GEMM on equal FLOPs under ncu:
    # clock, duration and the SpeedOfLight / memory throughputs of each kernel, averaged per kernel name and grid.
    # In the step all of them run at the 700 W cap, so what differs per FLOP (L2, shared memory, DRAM traffic) is
    # what the expert GEMMs' 0.88 of the LM head's rate (session 29) is made of. GGNCU_BENCH=--trainer-wgrad profiles the
    # weight gradient in the trainer's shape instead (8 micro-batches per call, each tail mode and cluster size).
    # ggncu_launches.txt lists every launch with its DRAM bytes read and written and its L2 hit rate (session 30 read
    # the DRAM traffic as throughput x duration: the forward W13 moved 9.0 GB against cuBLASLt's 4.4).
    CUDA_VISIBLE_DEVICES=0 timeout ${GGNCU_TIMEOUT:-400} "$NCU" --clock-control none --section SpeedOfLight \
      --section MemoryWorkloadAnalysis --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct \
      --kernel-name-base demangled -k regex:'grouped_sm90_kernel|nvjet|xmma' \
      --launch-count ${GGNCU_LAUNCHES:-120} --csv --log-file "$OUT/ggncu.csv" \
      "$BIN_DIR/bench_grouped_gemm" --no-wmma --shape 8x7B ${GGNCU_BENCH:---ops fwd} --runs 1 >"$OUT/ggncu_bench.log" 2>&1
    add "ncu grouped GEMM vs cuBLASLt" "rc=$?"
    # One pass over the CSV: per launch into ggncu_launches.txt, averaged per kernel and grid on stdout (ggncu.txt).
    python3 - "$OUT/ggncu.csv" "$OUT/ggncu_launches.txt" <<'PY' | tee "$OUT/ggncu.txt"
import collections, csv, math, re, sys
to_gb = {"byte": 1e-9, "Kbyte": 1e-6, "Mbyte": 1e-3, "Gbyte": 1.0}
to_ms = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0}
launches = {}
for r in csv.DictReader(l for l in open(sys.argv[1]) if l.startswith('"')):
    d = launches.setdefault(int(r["ID"]), {"name": re.sub(r"\(.*", "", r["Kernel Name"])[:70], "grid": r.get("Grid Size", "?"), "m": {}})
    try:
        v = float(r["Metric Value"].replace(",", ""))
    except ValueError:
        continue
    name, unit = r["Metric Name"], r["Metric Unit"]
    if name.startswith("dram__bytes"): v, unit = v * to_gb.get(unit, math.nan), "GB"
    if name == "Duration": v, unit = v * to_ms.get(unit, math.nan), "ms"
    if name == "SM Frequency": v, unit = v * {"hz": 1e-6, "Mhz": 1.0, "Ghz": 1e3}.get(unit, math.nan), "MHz"
    d["m"][f"{name} [{unit}]"] = v
cols = ["Duration [ms]", "dram__bytes_read.sum [GB]", "dram__bytes_write.sum [GB]", "lts__t_sector_hit_rate.pct [%]",
        "SM Frequency [MHz]"]
with open(sys.argv[2], "w") as out:
    print("id | kernel | grid | " + " | ".join(cols), file=out)
    for i, d in sorted(launches.items()):
        print(f"{i} | {d['name']} | {d['grid']} | " + " | ".join(f"{d['m'].get(c, math.nan):.4g}" for c in cols), file=out)
want = cols + ["Compute (SM) Throughput [%]", "DRAM Throughput [%]", "L2 Cache Throughput [%]",
               "L1/TEX Cache Throughput [%]"]
groups = collections.defaultdict(list)
for d in launches.values():
    groups[f"{d['name']} grid {d['grid']}"].append(d["m"])
for name, ms in groups.items():
    print(f"{name} (x{len(ms)}): " + ", ".join(
        f"{k} {sum(m.get(k, math.nan) for m in ms) / len(ms):.4g}" for k in want if any(k in m for m in ms)))
PY
    ;;
  wgncu)
    # The single-call W13 weight gradient (8x7B expert shapes, 16,384 rows) under ncu --set full, one launch each: our
    # kernel in one CTA and in pairs over m (the trainer's), each with and without its epilogue
    # (MXTRAIN_GG_FAULT=noepi: wrong sums, timing only), beside cuBLASLt's dense GEMM of equal FLOPs. Prints cycles,
    # tensor pipe, L2 and DRAM traffic and the least cycles the L2 needs for the dW adds (scripts/ncu_table.py);
    # per-SASS-line warp samples in wgncu_*_sass.csv (docs/perf.md, session 41).
    KD=nvjet K1='grouped_sm90_kernel<.*Mode\)2, \(int\)256, \(int\)1>' K2='grouped_sm90_kernel<.*Mode\)2, \(int\)256, \(int\)2>'
    # label, kernel regex, launches to skip (bench_grouped_gemm --runs 1 launches each variant 5 times; the pairs
    # over m come after the pairs sharing A), environment
    tables=()
    while read -r label k skip envs; do
      env $envs CUDA_VISIBLE_DEVICES=0 timeout 200 "$NCU" --clock-control none --set full --import-source no \
        --kernel-name-base demangled -k "regex:${!k}" --launch-skip "$skip" -c 1 --export "$OUT/wgncu_$label" -f \
        "$BIN_DIR/bench_grouped_gemm" --no-wmma --shape 8x7B --ops wgrad --runs 1 </dev/null >"$OUT/wgncu_$label.log" 2>&1
      add "ncu wgrad $label" "rc=$?"
      "$NCU" --import "$OUT/wgncu_$label.ncu-rep" --page raw --csv </dev/null >"$OUT/wgncu_${label}_raw.csv"
      "$NCU" --import "$OUT/wgncu_$label.ncu-rep" --page source --csv --print-source sass </dev/null \
        >"$OUT/wgncu_${label}_sass.csv"
      rm -f "$OUT/wgncu_$label.ncu-rep"  # 5-6 MB each; the CSVs hold what the table and the stall analysis read
      tables+=("$label=$OUT/wgncu_${label}_raw.csv")
    done <<'RUNS'
dense KD 0
c1 K1 0
c1_noepi K1 0 MXTRAIN_GG_FAULT=noepi
c2m K2 5
c2m_noepi K2 5 MXTRAIN_GG_FAULT=noepi
RUNS
    python3 scripts/ncu_table.py "${tables[@]}" | tee "$OUT/wgncu_table.md"
    ;;
  wgncu16)
    # The single-call weight gradient storing a bf16 dW (the recipe's expert_grad_dtype), W13 and W2, under ncu
    # --set full: cuBLASLt's dense GEMM storing bf16, our kernel (pairs over m), ours without its epilogue
    # (MXTRAIN_GG_FAULT=noepi: wrong sums, timing only) and, for W2, ours with the epilogue's two barriers per box
    # (the form before session 61). Each is picked by its NVTX range in bench_grouped_gemm's bf16 rotation, the
    # first two launches in it (ours: its check call, then its first timed call; cuBLASLt may launch two kernels a
    # call). Session 59: W13 0.90-0.96 of dense, W2 0.89 in four calls of four.
    tables=()
    while read -r label range envs; do
      env $envs CUDA_VISIBLE_DEVICES=0 timeout 200 "$NCU" --clock-control none --set full --import-source no \
        --nvtx --nvtx-include "$range/" -c 2 --export "$OUT/wgncu16_$label" -f \
        "$BIN_DIR/bench_grouped_gemm" --no-wmma --shape 8x7B --ops wgrad --runs 1 </dev/null >"$OUT/wgncu16_$label.log" 2>&1
      add "ncu wgrad bf16 $label" "rc=$?"
      "$NCU" --import "$OUT/wgncu16_$label.ncu-rep" --page raw --csv </dev/null >"$OUT/wgncu16_${label}_raw.csv"
      "$NCU" --import "$OUT/wgncu16_$label.ncu-rep" --page source --csv --print-source sass </dev/null \
        >"$OUT/wgncu16_${label}_sass.csv"
      rm -f "$OUT/wgncu16_$label.ncu-rep"
      tables+=("$label=$OUT/wgncu16_${label}_raw.csv")
    done <<'RUNS'
W2_dense wgrad_W2_bf16_dense X=1
W2_c2m wgrad_W2_bf16_c2m X=1
W2_c2m_noepi wgrad_W2_bf16_c2m MXTRAIN_GG_FAULT=noepi
W13_dense wgrad_W13_bf16_dense X=1
W13_c2m wgrad_W13_bf16_c2m X=1
W13_c2m_noepi wgrad_W13_bf16_c2m MXTRAIN_GG_FAULT=noepi
W2_c2m_bars2 wgrad_W2_bf16_c2m_bars2 X=1
RUNS
    python3 scripts/ncu_table.py "${tables[@]}" | tee "$OUT/wgncu16_table.md"
    ;;
  epiprobe)
    CUDA_VISIBLE_DEVICES=0 timeout 240 "$BIN_DIR/bench_wgrad_epilogue" </dev/null >"$OUT/epiprobe.log" 2>&1
    add "wgrad epilogue probe" "rc=$?"
    grep '^|' "$OUT/epiprobe.log"
    ;;
  cuda)
    CUDA_VISIBLE_DEVICES=0 timeout 300 "$BIN_DIR/mxtrain_tests" --gtest_filter='*Cuda*:*Gpu*:*Mxfp8*:-Binary.*' \
      >"$OUT/cuda_tests.log" 2>&1
    add "all CUDA tests" "rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/cuda_tests.log" | tr '\n' ' ')"
    grep -E '^\[  FAILED  \]|Failure|Expected|Which is|actual' "$OUT/cuda_tests.log" | head -30
    ;;
  parity)
    CUDA_VISIBLE_DEVICES=0 timeout 300 python3 scripts/parity_hf.py --mxtrain "$MX" --backend cuda \
      --out /tmp/parity_cuda >"$OUT/parity_cuda.log" 2>&1
    add "HF parity, CUDA backend" "rc=$? ($(grep -c '"passed": true' "$OUT/parity_cuda.log") pass, $(grep -c '"passed": false' "$OUT/parity_cuda.log") fail)"
    grep '^|' "$OUT/parity_cuda.log"
    # The same checks on the fp32 CUDA backend, held to the CPU backend's fp32 tolerances.
    CUDA_VISIBLE_DEVICES=0 timeout 300 python3 scripts/parity_hf.py --mxtrain "$MX" --backend cuda-fp32 \
      --out /tmp/parity_cuda_fp32 >"$OUT/parity_cuda_fp32.log" 2>&1
    add "HF parity, CUDA fp32 backend" "rc=$? ($(grep -c '"passed": true' "$OUT/parity_cuda_fp32.log") pass, $(grep -c '"passed": false' "$OUT/parity_cuda_fp32.log") fail)"
    grep '^|' "$OUT/parity_cuda_fp32.log"
    ;;
  trainer)
    CUDA_VISIBLE_DEVICES=0 timeout 400 python3 scripts/bench_trainer.py --mxtrain "$MX" \
      --hf-baseline "$BIN_DIR/hf_baseline.py" --sample-gpu --out "$OUT/bench_trainer" ${TRAINER_PRESETS:-L0_sanity 8x7B-2layer} \
      >"$OUT/bench_trainer.log" 2>&1
    add "trainer vs HF (L0, 8x7B 2 layers)" "rc=$?"
    grep '^|' "$OUT/bench_trainer.log"
    # L0_sanity once more without CUDA graphs: what the replay saves at the smallest shape
    CUDA_VISIBLE_DEVICES=0 "$MX" --config-name L0_sanity backend=cuda parallelism.ep_size=1 grad_acc_steps=8 \
      num_train_steps=30 lr_scheduler_kwargs.num_decay_steps=20 logger.frequency=1 cuda_graphs=false \
      output_dir="$OUT/l0_eager" >"$OUT/l0_eager.log" 2>&1
    add "L0_sanity eager (cuda_graphs=false)" "rc=$? $(metrics eager="$OUT/l0_eager/metrics.jsonl" | sed 's/.*median//')"
    ;;
  power)
    # each W13 GEMM held 5 s as cuBLASLt dense, our 1-CTA and our CTA-pair kernel, with clock and power sampled
    CUDA_VISIBLE_DEVICES=0 timeout 400 python3 scripts/gpu_samples.py run "$OUT/power_smi.csv" -- \
      "$BIN_DIR/bench_grouped_gemm" --no-wmma --shape 8x7B --runs 5 --sustain 5 >"$OUT/power_gg.log" 2>&1
    add "grouped GEMM held under the power cap" "rc=$?"
    grep -E '^\{' "$OUT/power_gg.log"
    grep -E '^\| (run|8x7B [a-z])' "$OUT/power_gg.log"  # the clock and power table
    ;;
  stages)
    for cfg in bench_8x1B bench_8x7B_2layer; do
      CUDA_VISIBLE_DEVICES=0 MXTRAIN_STAGE_TIMING=1 timeout 150 "$MX" --config-name $cfg backend=cuda \
        dataset.source=random num_train_steps=4 output_dir="$OUT/stages_$cfg" >"$OUT/stages_$cfg.log" 2>&1
      add "stage timing $cfg" "rc=$?"
      grep -A40 "stage times" "$OUT/stages_$cfg.log"
    done
    ;;
  ab)
    # Two builds or settings, alternating A B A B per shape. AB_A / AB_B: "DIR [VAR=value ...]" (each defaults to
    # BIN_DIR), e.g. AB_A=devbin/main AB_B="devbin/wip MXTRAIN_GG_ODD_TAIL=pad". tok/s as the HF baseline times it.
    for cfg in ${AB_CFGS:-bench_8x1B bench_8x7B_2layer}; do
      for run in A1 B1 A2 B2; do
        v=AB_${run:0:1}
        read -r dir envs <<<"${!v:-$BIN_DIR}"
        env $envs CUDA_VISIBLE_DEVICES=0 timeout 200 "$dir/mxtrain" --config-name $cfg backend=cuda \
          dataset.source=random num_train_steps=8 output_dir="$OUT/ab_${cfg}_$run" >"$OUT/ab_${cfg}_$run.log" 2>&1
        add "ab $cfg $run" "rc=$? $(tok_per_s "$OUT/ab_${cfg}_$run/metrics.jsonl")"
      done
      metrics A1="$OUT/ab_${cfg}_A1/metrics.jsonl" B1="$OUT/ab_${cfg}_B1/metrics.jsonl" | tail -1
    done
    ;;
  ops)
    for cfg in bench_8x1B bench_8x7B_2layer; do
      CUDA_VISIBLE_DEVICES=0 MXTRAIN_STAGE_TIMING=ops timeout 200 "$MX" --config-name $cfg backend=cuda \
        dataset.source=random num_train_steps=3 output_dir="$OUT/ops_$cfg" >"$OUT/ops_$cfg.log" 2>&1
      add "op timing $cfg" "rc=$?"
      grep -A45 "^op times" "$OUT/ops_$cfg.log"
    done
    ;;
  optim)
    CUDA_VISIBLE_DEVICES=0 timeout 400 python3 scripts/bench_optimizer_torch.py --hf-baseline "$BIN_DIR/hf_baseline.py" \
      --preset 8x7B-2layer >"$OUT/optim_torch.log" 2>&1
    add "torch optimizer step 8x7B 2L" "rc=$?"
    CUDA_VISIBLE_DEVICES=0 MXTRAIN_STAGE_TIMING=ops timeout 200 "$MX" --config-name bench_8x7B_2layer backend=cuda \
      dataset.source=random num_train_steps=3 output_dir="$OUT/optim_ops" >"$OUT/optim_ops.log" 2>&1
    add "mxtrain op table 8x7B 2L" "rc=$?"
    grep -h '^|' "$OUT/optim_torch.log"
    grep -hE '^op times|adamw|sum_squares|grad_reduce' "$OUT/optim_ops.log"
    ;;
  rate)
    CUDA_VISIBLE_DEVICES=0 timeout 150 "$BIN_DIR/mxtrain_tests" --gtest_filter='CudaWgmmaRateProbe.*' >"$OUT/rate_test.log" 2>&1
    add "wgmma rate probe tests" "rc=$?"
    CUDA_VISIBLE_DEVICES=0 timeout 200 "$BIN_DIR/bench_wgmma_rate" >"$OUT/rate.log" 2>&1
    add "bench_wgmma_rate" "rc=$?"
    grep -h '^|' "$OUT/rate.log"
    ;;
  speed)
    export CUDA_VISIBLE_DEVICES=0
    for sh in 8x1B 8x7B; do
      timeout 120 "$BIN_DIR/bench_attention" --shape $sh --no-reference >"$OUT/speed_attn_$sh.log" 2>&1
      add "bench_attention $sh" "rc=$?"
    done
    timeout 120 python3 scripts/bench_attention_torch.py >"$OUT/speed_attn_torch.log" 2>&1
    add "torch SDPA bench" "rc=$?"
    # with the CTA-pair rows (the trainer's default since session 24)
    timeout 300 "$BIN_DIR/bench_grouped_gemm" --no-wmma --shape 8x7B >"$OUT/speed_gg.log" 2>&1
    add "bench_grouped_gemm 8x7B" "rc=$?"
    timeout 400 python3 scripts/bench_trainer.py --mxtrain "$MX" --hf-baseline "$BIN_DIR/hf_baseline.py" \
      --sample-gpu --out "$OUT/speed_trainer" 8x1B 8x7B-2layer L0_sanity >"$OUT/speed_trainer.log" 2>&1
    add "trainer vs HF (8x1B, 8x7B 2L, L0)" "rc=$?"
    unset CUDA_VISIBLE_DEVICES
    grep -hE "^8x(1|7)B .*(flash-v0 |flash-v0 no-pp|torch-flash|torch-cudnn)" "$OUT"/speed_attn_*.log
    grep -h '^|' "$OUT/speed_gg.log" "$OUT/speed_trainer.log"
    ;;
  study)
    CUDA_VISIBLE_DEVICES=0 timeout 200 python3 scripts/router_precision_study.py >"$OUT/router_study.log" 2>&1
    add "router precision study" "rc=$?"
    tail -20 "$OUT/router_study.log"
    ;;
  mxgpu)
    CUDA_VISIBLE_DEVICES=0 timeout 300 "$BIN_DIR/mxtrain_tests" \
      --gtest_filter='*Mxfp8*:*CudaMx*:Formats/CudaMx*' >"$OUT/mx_tests.log" 2>&1
    add "MXFP8 CUDA tests" "rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/mx_tests.log" | tr '\n' ' ')"
    grep -E '^\[  FAILED  \]|Failure|Expected|Which is|actual' "$OUT/mx_tests.log" | head -30
    ;;
  conv)
    L0C="--config-name L0_sanity parallelism.ep_size=1 backend=cuda num_train_steps=300 \
         lr_scheduler_kwargs.num_warmup_steps=20 lr_scheduler_kwargs.num_decay_steps=280"
    # bf16 and MXFP8 side by side on GPUs 0 and 1, or one after the other on a single GPU.
    pair() {  # name, mxtrain arguments...
      local name=$1; shift
      if [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 2 ]; then
        CUDA_VISIBLE_DEVICES=0 timeout 400 "$MX" "$@" output_dir="$OUT/conv_${name}_bf16" >"$OUT/conv_${name}_bf16.log" 2>&1 &
        CUDA_VISIBLE_DEVICES=1 timeout 400 "$MX" "$@" fp8_config.enabled=true output_dir="$OUT/conv_${name}_mx" \
          >"$OUT/conv_${name}_mx.log" 2>&1
        wait
      else
        CUDA_VISIBLE_DEVICES=0 timeout 400 "$MX" "$@" output_dir="$OUT/conv_${name}_bf16" >"$OUT/conv_${name}_bf16.log" 2>&1
        CUDA_VISIBLE_DEVICES=0 timeout 400 "$MX" "$@" fp8_config.enabled=true output_dir="$OUT/conv_${name}_mx" \
          >"$OUT/conv_${name}_mx.log" 2>&1
      fi
    }
    pair l0 $L0C
    metrics bf16="$OUT/conv_l0_bf16/metrics.jsonl" mxfp8="$OUT/conv_l0_mx/metrics.jsonl" | tail -1
    C8="--config-name bench_8x1B backend=cuda num_train_steps=300 grad_acc_steps=1 adamw_kwargs.lr=3e-4 \
        lr_scheduler_kwargs.num_warmup_steps=20 lr_scheduler_kwargs.num_decay_steps=280 logger.frequency=1"
    pair 8x1b $C8
    python3 - "$OUT" <<'PY' | tee "$OUT/conv.txt"
import json, sys
out = sys.argv[1]
for name in ("l0", "8x1b"):
    try:
        a = [json.loads(l)["loss"] for l in open(f"{out}/conv_{name}_bf16/metrics.jsonl")]
        b = [json.loads(l)["loss"] for l in open(f"{out}/conv_{name}_mx/metrics.jsonl")]
    except OSError as e:
        print(name, e); continue
    tail = lambda v: sum(v[-20:]) / len(v[-20:])
    # spikes: a loss above 1.3x the median of the previous 10 steps, after step 50 (step numbers 1-based)
    spikes = lambda v: [i + 1 for i in range(50, len(v)) if v[i] > 1.3 * sorted(v[i - 10:i])[5]]
    print(f"{name}: steps bf16 {len(a)} mxfp8 {len(b)}; final (mean of last 20) bf16 {tail(a):.4f} mxfp8 {tail(b):.4f} "
          f"rel diff {abs(tail(b) - tail(a)) / tail(a):.3%}; max loss after step 50 bf16 {max(a[50:]):.3f} mxfp8 {max(b[50:]):.3f}; "
          f"spikes bf16 {spikes(a)} mxfp8 {spikes(b)}")
PY
    python3 scripts/plot_compare.py -o "$OUT/mxfp8_convergence.png" \
      "L0_sanity, 1 GPU, 300 steps:bf16=$OUT/conv_l0_bf16/metrics.jsonl,MXFP8=$OUT/conv_l0_mx/metrics.jsonl" \
      "8x1B, seq 4096, 300 steps:bf16=$OUT/conv_8x1b_bf16/metrics.jsonl,MXFP8=$OUT/conv_8x1b_mx/metrics.jsonl" \
      >"$OUT/plot.log" 2>&1 || echo "plot_compare.py failed (no matplotlib?): the curves are in $OUT/conv_*"
    add "convergence bf16 vs MXFP8" "$(tr '\n' ' ' <"$OUT/conv.txt" | cut -c1-300)"
    ;;
  fp8speed)
    B8="--config-name bench_8x1B backend=cuda $DATA"
    CUDA_VISIBLE_DEVICES=0 "$MX" $B8 output_dir="$OUT/sp_bf16" >"$OUT/sp_bf16.log" 2>&1
    CUDA_VISIBLE_DEVICES=0 "$MX" $B8 fp8_config.enabled=true output_dir="$OUT/sp_mx" >"$OUT/sp_mx.log" 2>&1
    CUDA_VISIBLE_DEVICES=0 "$MX" $B8 fp8_config.enabled=true fp8_config.hopper_gemm=fp8 output_dir="$OUT/sp_mxk" \
      >"$OUT/sp_mxk.log" 2>&1
    CUDA_VISIBLE_DEVICES=0 timeout 300 python3 "$BIN_DIR/hf_baseline.py" --preset 8x1B --seq 4096 --mbs 1 \
      --acc 8 >"$OUT/sp_hf.log" 2>&1
    metrics bf16="$OUT/sp_bf16/metrics.jsonl" mxfp8="$OUT/sp_mx/metrics.jsonl" \
      mxfp8_fp8_kernels="$OUT/sp_mxk/metrics.jsonl" | tee "$OUT/sp.txt"
    grep -h "peak allocated" "$OUT/sp_bf16.log" "$OUT/sp_mx.log" "$OUT/sp_mxk.log" | sed 's/^.*\] //' |
      tee -a "$OUT/sp.txt"
    tail -5 "$OUT/sp_hf.log" | tee -a "$OUT/sp.txt"
    add "8x1B speed bf16/MXFP8/HF" "$(head -2 "$OUT/sp.txt" | tr '\n' ' ' | cut -c1-300)"
    ;;
  dpov)
    B8="--config-name bench_8x1B backend=cuda num_train_steps=6 grad_acc_steps=8 lr_scheduler_kwargs.num_decay_steps=5"
    for v in false true; do
      MXTRAIN_STAGE_TIMING=1 MXTRAIN_COMM_TIMING=1 timeout 300 "${MPIRUN[@]}" -x MXTRAIN_STAGE_TIMING -np 2 "$MX" $B8 \
        parallelism.dp_size=2 parallelism.ep_size=1 parallelism.overlap_grad_reduce=$v output_dir="$OUT/dpov_$v" \
        >"$OUT/dpov_$v.log" 2>&1
      add "8x1B DP=2 overlap_grad_reduce=$v" "rc=$?"
      grep -h "grad_reduce + optimizer\|reduce_s\|all_gather" "$OUT/dpov_$v.log" | sed 's/^.*\] //' | head -6
    done
    metrics after="$OUT/dpov_false/metrics.jsonl" during="$OUT/dpov_true/metrics.jsonl" | tee "$OUT/dpov.txt"
    add "8x1B DP=2 grad reduce after/during" "$(grep -h 'median tok/s\|max rel' "$OUT/dpov.txt" | sed 's/steps 6, loss.*median//' | tr '\n' ' ')"
    ;;
  ov8x7b)
    for v in on:0 on:16 off:0; do
      B7="--config-name L1_8x7B_ep backend=cuda parallelism.ep_size=2 config_kwargs.num_hidden_layers=2 \
          num_train_steps=4 grad_acc_steps=8 lr_scheduler_kwargs.num_warmup_steps=1 lr_scheduler_kwargs.num_decay_steps=3"
      run="ov7_${v/:/_}"
      MXTRAIN_STAGE_TIMING=1 MXTRAIN_COMM_TIMING=1 MXTRAIN_OVERLAP_SMS=${v#*:} timeout 200 "${MPIRUN[@]}" \
        -x MXTRAIN_STAGE_TIMING -x MXTRAIN_OVERLAP_SMS -np 2 "$MX" $B7 \
        parallelism.ep_overlap=$([[ ${v%%:*} == on ]] && echo true || echo false) output_dir="$OUT/$run" \
        >"$OUT/$run.log" 2>&1
      add "8x7B 2L EP=2 MXFP8 overlap $v" "rc=$? $(metrics x="$OUT/$run/metrics.jsonl" | sed 's/.*median//')"
      grep -h "all_to_all_v\|ep combine (backward" "$OUT/$run.log" | sed 's/^.*\] //' | head -6
    done
    ;;
  ep8x7b)
    # MXFP8 (the L1 run's precision) and bf16, 8 layers each (both plans fit 141 GB; 6 layers if 8 do not).
    for fp8 in true false; do
      for layers in 8 6; do
        B7="--config-name L1_8x7B_ep backend=cuda parallelism.ep_size=2 config_kwargs.num_hidden_layers=$layers \
            fp8_config.enabled=$fp8 num_train_steps=4 grad_acc_steps=8 logger.frequency=1 \
            lr_scheduler_kwargs.num_warmup_steps=1 lr_scheduler_kwargs.num_decay_steps=3 checkpoint.ckpt_dir=null"
        run="8x7b_ep2_${layers}_fp8_$fp8"
        MXTRAIN_STAGE_TIMING=1 MXTRAIN_COMM_TIMING=1 timeout 280 "${MPIRUN[@]}" -x MXTRAIN_STAGE_TIMING -np 2 "$MX" $B7 \
          output_dir="$OUT/$run" >"$OUT/$run.log" 2>&1
        rc=$?
        add "8x7B ${layers}L EP=2 fp8=$fp8" "rc=$rc"
        [[ $rc -eq 0 ]] && break
      done
      { metrics ep2="$OUT/$run/metrics.jsonl"
        grep -h "total:\|comm timing\|peak allocated\|EP exchanges" "$OUT/$run.log" | sed 's/^.*\] //'
        grep -h -A16 "stage times" "$OUT/$run.log" | grep -v "^\s*layer\b" | head -40; } | tee "$OUT/$run.txt"
      add "8x7B ${layers}L EP=2 fp8=$fp8" "$(head -1 "$OUT/$run.txt" | sed 's/steps 4, loss.*median//' | cut -c1-120)"
    done
    ;;
  *) echo "unknown section $section" >&2 ;;
  esac
done

echo
echo "| check | result |"
echo "|---|---|"
printf '%s\n' "${summary[@]}"
