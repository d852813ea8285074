#!/usr/bin/env python3
"""PyTorch's SDPA (flash backend; cuDNN's too where it runs) on the shapes of tests/bench/bench_attention.cpp:
causal GQA forward, backward and forward+backward at B=1, S=4096, bf16, printing the same table (same FLOP
convention: forward 4 * B * H * S^2 * D / 2, backward 2.5x that), for comparison in the same device call:

    build/tests/bench_attention && python3 scripts/bench_attention_torch.py

Inputs use the trainer's layout, [B, S, H, D] seen as [B, H, S, D] (strided, last dim contiguous). GQA goes
through enable_gqa=True where the backend takes it, else K/V are repeated to H heads inside the timed region
(the row says which). Timing: CUDA events, warm-up, median (min in brackets) of --runs runs.
"""
import argparse
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = [("8x1B", 16, 8, 128), ("8x7B", 32, 8, 128), ("d64", 16, 8, 64), ("d64h32", 32, 8, 64)]
B, S = 1, 4096


def time_ms(fn, runs, warm=3):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times), min(times)


def make_attn(backend, gqa_native, H, KVH):
    group = H // KVH

    def attn(q, k, v):
        with sdpa_kernel([backend]):
            if gqa_native:
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            return F.scaled_dot_product_attention(q, k.repeat_interleave(group, dim=1),
                                                  v.repeat_interleave(group, dim=1), is_causal=True)
    return attn


def bench(backend, name, shape, runs):
    sname, H, KVH, D = shape
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(1)

    def rnd(heads):  # uniform in [-1.7, 1.7): std about 1, like the C++ benchmark
        x = (torch.rand(B, S, heads, D, device=dev, generator=gen) * 3.4 - 1.7).to(torch.bfloat16)
        return x.transpose(1, 2).requires_grad_(True)  # [B, H, S, D] view of [B, S, H, D]

    q, k, v = rnd(H), rnd(KVH), rnd(KVH)
    dout = (torch.rand(B, S, H, D, device=dev, generator=gen) * 3.4 - 1.7).to(torch.bfloat16).transpose(1, 2)
    attn, how = None, ""
    for gqa_native in (True, False):
        try:
            f = make_attn(backend, gqa_native, H, KVH)
            out = f(q, k, v)
            torch.autograd.grad(out, (q, k, v), dout)
            torch.cuda.synchronize()
            attn, how = f, ("enable_gqa" if gqa_native else "repeat kv")
            break
        except RuntimeError as e:  # backend refuses this input
            err = str(e).splitlines()[0]
    if attn is None:
        print(f"{sname:8s} {H:3d} {KVH:3d} {D:4d}  {name:18s} not available: {err}")
        return

    out = attn(q, k, v)
    fwd = time_ms(lambda: attn(q, k, v), runs)
    bwd = time_ms(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), runs)

    def fwd_bwd():
        o = attn(q, k, v)
        torch.autograd.grad(o, (q, k, v), dout)
    fb = time_ms(fwd_bwd, runs)
    ff = 4.0 * B * H * S * S * D / 2.0
    print(f"{sname:8s} {H:3d} {KVH:3d} {D:4d}  {name:18s} {fwd[0]:6.3f} [{fwd[1]:6.3f}] {ff / fwd[0] / 1e9:7.1f} "
          f"{bwd[0]:6.3f} [{bwd[1]:6.3f}] {2.5 * ff / bwd[0] / 1e9:7.1f} {fb[0]:7.3f} [{fb[1]:7.3f}] "
          f"{3.5 * ff / fb[0] / 1e9:7.1f}  ({how})", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--shape", default="all", help="8x1B, 8x7B, d64, d64h32 or all")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_attention_torch.py: no CUDA device", file=sys.stderr)
        return 1
    print(f"bench_attention_torch.py: {torch.cuda.get_device_name()}, torch {torch.__version__}; B={B} S={S} "
          f"causal GQA bf16; median of {args.runs} runs (min in brackets)")
    print(f"{'shape':8s} {'H':>3s} {'KVH':>3s} {'D':>4s}  {'impl':18s} {'fwd ms [min]':>15s} {'TFLOP/s':>7s} "
          f"{'bwd ms [min]':>15s} {'TFLOP/s':>7s} {'fwd+bwd ms [min]':>17s} {'TFLOP/s':>7s}")
    backends = [(SDPBackend.FLASH_ATTENTION, "torch-flash")]
    if hasattr(SDPBackend, "CUDNN_ATTENTION"):
        backends.append((SDPBackend.CUDNN_ATTENTION, "torch-cudnn"))
    for shape in SHAPES:
        if args.shape not in ("all", shape[0]):
            continue
        for backend, name in backends:
            bench(backend, name, shape, args.runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
