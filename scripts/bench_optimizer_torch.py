#!/usr/bin/env python3
"""The optimizer step alone, on the HF baseline's own model: what hf_baseline.py's step spends in AdamW, beside the
same update with the recipe's numerics (fp32 parameters and moments, as mxtrain keeps them) and its clipping.

mxtrain's step keeps fp32 master weights and Adam moments and clips the gradient norm (the recipe's L0_sanity /
L1_8x7B_ep settings); hf_baseline.py updates bf16 parameters with fused AdamW and does not clip. This measures
the difference on the GPU instead of estimating it from bytes (docs/perf.md). Each variant: the model's parameters
(MixtralForCausalLM at the preset's shape, the same as hf_baseline.py builds) with random gradients, 3 warm-up
steps, then the median of --steps timed steps (CUDA events). Prints one JSON line per variant, then a table.

  python3 scripts/bench_optimizer_torch.py --hf-baseline ../shared/bench/hf_baseline.py --preset 8x7B-2layer
"""
import argparse
import gc
import importlib.util
import json
import statistics

import torch
from transformers import MixtralConfig, MixtralForCausalLM


def load_presets(path):
    spec = importlib.util.spec_from_file_location("hf_baseline", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.PRESETS


def time_variant(name, cfg, dtype, clip, steps):
    torch.manual_seed(0)
    with torch.device("cuda"):  # initialised on the GPU: seconds instead of minutes for billions of parameters
        m = MixtralForCausalLM(cfg).to(dtype)
    params = [p for p in m.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    n = sum(p.numel() for p in params)
    opt = torch.optim.AdamW(params, lr=1e-4, fused=True)
    times = []
    for i in range(3 + steps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        if clip:
            torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        opt.step()
        b.record()
        torch.cuda.synchronize()
        if i >= 3:
            times.append(a.elapsed_time(b))
    ms = statistics.median(times)
    # Least bytes each update moves per parameter: read parameter, gradient, two moments; write parameter, moments
    # (the clip reads the gradients once more and scales them: a read and a write).
    e = torch.finfo(dtype).bits // 8
    per = 7 * e + (3 * e if clip else 0)
    r = {"name": name, "params": n, "ms": round(ms, 3), "bytes_per_param": per,
         "tb_per_s": round(n * per / (ms * 1e-3) / 1e12, 2)}
    print(json.dumps(r), flush=True)
    del opt, params, m
    gc.collect()
    torch.cuda.empty_cache()
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hf-baseline", required=True, help="path to hf_baseline.py (its presets)")
    ap.add_argument("--preset", default="8x7B-2layer")
    ap.add_argument("--steps", type=int, default=10)
    a = ap.parse_args()
    presets = load_presets(a.hf_baseline)
    if a.preset not in presets:
        raise SystemExit(f"bench_optimizer_torch.py: no preset '{a.preset}' in {a.hf_baseline}")
    cfg = MixtralConfig(**presets[a.preset])
    rows = [
        time_variant("HF baseline: bf16 parameters and moments, fused AdamW, no clipping", cfg, torch.bfloat16,
                     False, a.steps),
        time_variant("fp32 parameters and moments, fused AdamW", cfg, torch.float32, False, a.steps),
        time_variant("fp32, clip_grad_norm_(1.0) + fused AdamW (the recipe's update)", cfg, torch.float32, True,
                     a.steps),
    ]
    print(f"| {a.preset} optimizer step | ms | bytes / param | TB/s |\n| --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['name']} | {r['ms']:.2f} | {r['bytes_per_param']} | {r['tb_per_s']:.2f} |")


if __name__ == "__main__":
    main()
