#!/usr/bin/env python3
"""Projects the L1_8x7B_ep step (32 layers, EP=8 on 8 GPUs, micro-batch 1 x 4096, grad_acc_steps 1) from a run of
the same layer shape on 2 GPUs (EP=2, fewer layers, grad_acc_steps n_mb) logged with MXTRAIN_STAGE_TIMING=1 and
MXTRAIN_COMM_TIMING=1 (scripts/device_dist_checks.sh ep8x7b). Usage:
  python3 scripts/project_l1.py docs/data/8x7b_ep2_8_fp8_true.log [--layers 8 --n-mb 8 --ep 8 --target-layers 32]

Per rank and per layer x micro-batch, from the EP=2 run (means over both ranks unless said):
  attn       attention forward + backward stages (dense: unchanged by EP)
  moe_local  MoE forward + backward minus every "ep ..." stage: router, permutes, the experts' GEMMs for the rows
             this rank received (on average T*k rows per rank at any EP size, since E/ep experts get 1/ep of them)
  ep         the "ep ..." stages: the token exchanges, the per-layer host sync of the counts, the reorders, and
             waiting for the slower peer
  a2a        median time of one non-overlapped token exchange (NCCL timing, rank 0)
Assumptions of the projection, stated:
  A1 the exchanged bytes per rank grow from (ep-1)/ep = 1/2 to 7/8 of T*k rows per exchange, 4 big exchanges per
     layer x micro-batch, at the per-GPU NVLink rate measured on 2 GPUs (NVSwitch gives each H200 the same links);
  A2 what the least-waiting rank spends in "ep" stages beyond the transfers is a fixed cost per layer (host sync,
     reorders), independent of ep;
  A3 the rest (mean minus least-waiting rank) is load imbalance; with 8 ranks the slowest of 8 is further above
     the mean than the slower of 2: for normally distributed per-rank loads E[max of 8] - mean = 1.42 sigma
     against 0.56 sigma for 2 ranks, so that part is scaled by 2.5 (g); g = 1 and a balanced router (g = 0) are
     printed beside it;
  A4 the optimizer step costs what it cost per step on 2 GPUs (the same expert parameters per rank: 32 layers x 1
     expert = 8 layers x 4 experts; dense AdamW shards 8 ways instead of 2) and runs once per micro-batch (L1 has
     grad_acc_steps 1); the LM head per micro-batch is unchanged.
"""
import argparse
import re
import statistics
import sys


def parse(path):
    stages, a2a, rows, load = {}, None, {}, None
    cur = None
    for line in open(path):
        m = re.match(r"stage times \(GPU, compute stream\), world rank (\d+), over (\d+) steps:", line)
        if m:
            cur = stages.setdefault(int(m.group(1)), {})
            cur["__steps"] = int(m.group(2))
            continue
        m = re.match(r"\s{2}(\S.*?)\s+([\d.]+) ms total\s+([\d.]+) ms/step\s+x(\d+)", line)
        if m and cur is not None:
            cur[m.group(1)] = float(m.group(3))
            continue
        cur = None if not line.startswith("  ") else cur
        m = re.search(r"comm timing, ep group .* all_to_all_v x\d+ total [\d.]+ ms, median ([\d.]+) ms", line)
        if m and a2a is None:
            a2a = float(m.group(1))
        m = re.search(r"EP exchanges \(after the first step\), world rank (\d+): .* received (\d+) \(max (\d+)\)", line)
        if m:
            rows[int(m.group(1))] = (int(m.group(2)), int(m.group(3)))
        m = re.search(r"EP load: .* critical path is ([\d.]+)x a balanced one", line)
        if m:
            load = float(m.group(1))
    if not stages or a2a is None:
        sys.exit(f"{path}: no stage times or no NCCL timing (run with MXTRAIN_STAGE_TIMING=1 MXTRAIN_COMM_TIMING=1)")
    return stages, a2a, rows, load


def main():
    p = argparse.ArgumentParser()
    p.add_argument("log")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--n-mb", type=int, default=8, help="micro-batches per step in the measured run")
    p.add_argument("--ep", type=int, default=8)
    p.add_argument("--target-layers", type=int, default=32)
    p.add_argument("--tokens", type=int, default=4096, help="tokens per micro-batch per rank")
    a = p.parse_args()
    stages, a2a, rows, load = parse(a.log)
    per = a.layers * a.n_mb
    ranks = sorted(stages)
    get = lambda r, k: stages[r].get(k, 0.0)
    ep_stage = {r: sum(v for k, v in stages[r].items() if k.startswith("ep ")) / per for r in ranks}
    attn = statistics.mean((get(r, "attention") + get(r, "attention backward")) / per for r in ranks)
    moe_local = statistics.mean((get(r, "moe") + get(r, "moe backward")) / per - ep_stage[r] for r in ranks)
    head = statistics.mean(get(r, "lm head + loss (forward and backward)") / a.n_mb for r in ranks)
    opt = statistics.mean(get(r, "grad_reduce + optimizer") + get(r, "quantize fp8 weights") for r in ranks)
    step2 = statistics.mean(get(r, "micro_batch") for r in ranks) + opt
    transfer2 = 4 * a2a
    fixed = max(0.0, min(ep_stage.values()) - transfer2)
    imbalance2 = statistics.mean(ep_stage.values()) - min(ep_stage.values())
    transfer8 = transfer2 * ((a.ep - 1) / a.ep) / 0.5
    print(f"measured (EP=2, {a.layers} layers, {a.n_mb} micro-batches/step), per layer x micro-batch, ms:")
    print(f"  attention fwd+bwd {attn:.2f} | MoE local (router, permutes, experts) {moe_local:.2f} | "
          f"ep stages per rank " + ", ".join(f"r{r} {ep_stage[r]:.2f}" for r in ranks) +
          f" | one exchange (median) {a2a:.3f}")
    print(f"  per micro-batch: LM head {head:.1f} ms; per step: optimizer {opt:.1f} ms; step {step2:.0f} ms "
          f"-> {a.n_mb * a.tokens * 1e3 / step2:,.0f} tokens/s per GPU")
    if rows:
        print("  rows received per layer (mean, max): " + ", ".join(f"r{r} {v[0]} ({v[1]})" for r, v in rows.items()))
    if load:
        print(f"  busiest EP rank's rows per layer / the mean rank's (logged since 869c3db): {load:.3f}")
    print(f"  split of the ep stages: transfers {transfer2:.2f}, fixed (host sync, reorders) {fixed:.2f}, "
          f"imbalance {imbalance2:.2f}")
    print(f"\nprojection: {a.target_layers} layers, EP={a.ep}, 1 micro-batch of {a.tokens} tokens per rank per step")
    print("| router balance | ms per layer | step ms | tokens/s per GPU | tokens/s (8 GPUs) | ep share |")
    print("|---|---|---|---|---|---|")
    for name, g in (("balanced (g=0)", 0.0), ("as on 2 ranks (g=1)", 1.0), ("8-rank imbalance (g=2.5)", 2.5)):
        ep8 = transfer8 + fixed + g * imbalance2
        layer = attn + moe_local + ep8
        step = a.target_layers * layer + head + opt
        tps = a.tokens * 1e3 / step
        print(f"| {name} | {layer:.2f} | {step:.0f} | {tps:,.0f} | {8 * tps:,.0f} | "
              f"{a.target_layers * ep8 / step:.0%} |")


if __name__ == "__main__":
    main()
