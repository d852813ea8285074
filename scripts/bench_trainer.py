#!/usr/bin/env python3
"""mxtrain's trainer beside the HF transformers baseline, in one call on one GPU.

For each preset: mxtrain --config-name bench_<preset> (6 optimizer steps of 8 x 4096 tokens; L0_sanity: 30 steps
of 8 x 128 tokens on one GPU), then
hf_baseline.py --preset <preset> on the same shape and batch. Both are timed the same way: the HF script runs 2
warm-up steps and divides the tokens of the next ones by their time; mxtrain's figure is the tokens of its steps after
the first 2 over the sum of those steps' times (until session 16: the median of steps 2-4 of 4, which counted the
slower second step). Prints tokens/s, model TFLOP/s (the HF script's
FLOP formula) and the ratio; writes one JSON line per run to --out.
mxtrain reads uniform random token ids (dataset.source=random), as the HF script does; --data embedded trains on the
embedded byte-level corpus instead (the rows in docs/perf.md before session 15), whose skewed tokens unbalance the
experts' loads.

  python3 scripts/bench_trainer.py --mxtrain build/mxtrain --hf-baseline ../shared/bench/hf_baseline.py 8x1B
--hf-baseline none skips the baseline (a second mxtrain variant beside a baseline already run in the same call).
Each row carries the wall-clock start and end of both runs (epoch seconds), to line them up with a GPU sampler;
--sample-gpu runs one (nvidia-smi, every 200 ms, into OUT/gpu_samples.csv) and prints each run's SM clock and power
at the end (scripts/gpu_samples.py): an H200 training step sits at its 700 W cap, so the clock tells the story.
"""
import argparse, json, os, subprocess, sys, time

# The recipe's own options for the gradient and the master (docs/perf.md, session 58: +1.1% at 8x7B): bf16 expert
# gradients (its bf16 params' .grad, here rounded once per step) and optimizer_store_param_remainders (the same fp32
# masters in 2 fewer bytes). --set expert_grad_dtype=float32 --set optimizer_store_param_remainders=false undoes them.
RECIPE_GRADS = ["expert_grad_dtype=bfloat16", "optimizer_store_param_remainders=true"]
# The LM head's gradient in bf16 too, where one GEMM per step stores it (lm_head_wgrad_micro_batches, set only by the
# 8x7B config): the baseline's dtype for every gradient; sessions 63-64, on an H100, +0.2% over three alternating
# rounds and 0.98 GiB less memory. --set lm_head_grad_dtype=float32 undoes it.
RECIPE_GRADS_HEAD = RECIPE_GRADS + ["lm_head_grad_dtype=bfloat16"]

SHAPES = {  # preset: (our config name and overrides, HF shape numbers for the FLOP formula, seq, HF steps)
    "8x1B": ("bench_8x1B", RECIPE_GRADS, dict(d=2048, f=4096, L=16, H=16, KVH=8, E=8, k=2, V=128256), 4096, 4),
    "8x7B-2layer": ("bench_8x7B_2layer", RECIPE_GRADS_HEAD,
                    dict(d=4096, f=14336, L=2, H=32, KVH=8, E=8, k=2, V=128256), 4096, 4),
    # L0_sanity on one GPU with the HF preset's batch (seq 128, micro-batch 1, 8 accumulation steps)
    "L0_sanity": ("L0_sanity", ["parallelism.ep_size=1", "grad_acc_steps=8", "num_train_steps=30",
                                "lr_scheduler_kwargs.num_decay_steps=20", "logger.frequency=1"],
                  dict(d=256, f=512, L=2, H=4, KVH=2, E=4, k=2, V=128256), 128, 20),
}


WARMUP_STEPS = 2  # hf_baseline.py's default --warmup


def flops_per_token(s, S):
    """6 * N_active + 6 * L * d * S, as in hf_baseline.py (causal attention counted as half)."""
    d, f, L, V, H, KVH = s["d"], s["f"], s["L"], s["V"], s["H"], s["KVH"]
    hd = d // H
    attn = d * H * hd + 2 * d * KVH * hd + H * hd * d
    moe = s["k"] * 3 * d * f + d * s["E"]
    return 6 * (L * (attn + moe) + d * V) + 6 * L * d * S


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("presets", nargs="+", choices=sorted(SHAPES))
    ap.add_argument("--mxtrain", default="build/mxtrain")
    ap.add_argument("--hf-baseline", default="../shared/bench/hf_baseline.py")
    ap.add_argument("--out", default="/tmp/bench")
    ap.add_argument("--data", choices=["random", "embedded"], default=os.environ.get("BENCH_DATA", "random"))
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="an extra override for every mxtrain run (e.g. expert_wgrad_micro_batches=2); repeatable")
    ap.add_argument("--init-cache", metavar="DIR",
                    help="MXTRAIN_INIT_CACHE for the mxtrain runs: the initial weights drawn once per model and read "
                         "back after (the 8x7B preset's 15.8 GB took 11.9 s of an 18 s run to draw); the timed steps "
                         "are the same")
    ap.add_argument("--sample-gpu", action="store_true",
                    help="sample SM clock and board power with nvidia-smi and summarise them per run at the end")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rows = []
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import gpu_samples
    samples_path = os.path.join(a.out, "gpu_samples.csv")
    sampler = gpu_samples.start_sampler(samples_path) if a.sample_gpu else None
    if a.sample_gpu and sampler is None:
        sys.stderr.write("--sample-gpu: no nvidia-smi on PATH, nothing sampled\n")
    for preset in a.presets:
        cfg, overrides, shape, seq, hf_steps = SHAPES[preset]
        run_dir = os.path.join(a.out, cfg)
        log = os.path.join(a.out, cfg + ".log")
        t0 = time.time()
        with open(log, "w") as f:
            env = dict(os.environ, MXTRAIN_INIT_CACHE=a.init_cache) if a.init_cache else None
            rc = subprocess.run([a.mxtrain, "--config-name", cfg, "backend=cuda", f"dataset.source={a.data}",
                                 f"output_dir={run_dir}"] + overrides + a.set, stdout=f, stderr=subprocess.STDOUT,
                                env=env).returncode
        ours = None
        if rc == 0:
            steps = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
            w = steps[WARMUP_STEPS - 1]  # logger.frequency 1: one line per step, tokens and elapsed_s cumulative
            ours = (steps[-1]["tokens"] - w["tokens"]) / (steps[-1]["elapsed_s"] - w["elapsed_s"])
        else:
            sys.stderr.write(open(log).read()[-2000:])
        t1 = time.time()
        theirs = None
        if a.hf_baseline != "none":
            hf = subprocess.run([sys.executable, a.hf_baseline, "--preset", preset, "--seq", str(seq), "--mbs", "1",
                                 "--acc", "8", "--steps", str(hf_steps), "--warmup", str(WARMUP_STEPS)],
                                capture_output=True, text=True)
            hf_line = [l for l in hf.stdout.splitlines() if l.startswith("{")]
            theirs = json.loads(hf_line[-1])["tokens_per_s"] if hf_line else None
            if not hf_line:
                sys.stderr.write(hf.stderr[-2000:])
        t2 = time.time()
        fpt = flops_per_token(shape, seq)
        row = dict(preset=preset, mxtrain_tokens_per_s=ours, hf_tokens_per_s=theirs,
                   mxtrain_tflops=ours and round(ours * fpt / 1e12, 1), hf_tflops=theirs and round(theirs * fpt / 1e12, 1),
                   ratio=(ours / theirs) if ours and theirs else None, mxtrain_rc=rc, mxtrain_data=a.data,
                   overrides=a.set, mxtrain_wall=[round(t0, 1), round(t1, 1)], hf_wall=[round(t1, 1), round(t2, 1)])
        rows.append(row)
        print(json.dumps(row), flush=True)
        with open(os.path.join(a.out, "bench.jsonl"), "a") as f:
            f.write(json.dumps(row) + "\n")
    if sampler is not None:
        sampler.terminate()
        sampler.wait()
        print()
        gpu_samples.report(samples_path, rows)
    # Three decimals: at two, 1.397 prints as 1.40, a goal of 1.4x that reads as met (session 59).
    print("\n| preset | mxtrain data | mxtrain tok/s | TFLOP/s | HF tok/s | TFLOP/s | ratio |\n"
          "|---|---|---|---|---|---|---|")
    for r in rows:
        fmt = lambda x, p=0: "-" if x is None else f"{x:,.{p}f}"
        print(f"| {r['preset']} | {r['mxtrain_data']} | {fmt(r['mxtrain_tokens_per_s'])} | {fmt(r['mxtrain_tflops'], 1)} | "
              f"{fmt(r['hf_tokens_per_s'])} | {fmt(r['hf_tflops'], 1)} | {fmt(r['ratio'], 3)} |")


if __name__ == "__main__":
    main()
