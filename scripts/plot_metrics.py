#!/usr/bin/python3
"""Plot an mxtrain metrics JSONL (one JSON object per logged step) as one PNG with three panels:
loss, learning rate and throughput (tokens/s) against step. Where validation.jsonl (the held-out loss,
validation.every_n_steps) lies beside the metrics file, its loss is drawn in the loss panel too.

usage: plot_metrics.py metrics.jsonl [--validation validation.jsonl] -o out.png

Needs matplotlib (Debian: apt-get install python3-matplotlib); the shebang is Debian's python3, which
is where that package installs.
"""
import argparse
import json
import math
import os
import sys


def read_rows(path):
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.readlines()
    except OSError as e:
        sys.exit(f"plot_metrics: cannot read {path}: {e.strerror}")
    rows = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            sys.exit(f"plot_metrics: {path} line {n} is not valid JSON: {e.msg}")
        if not isinstance(row, dict) or "step" not in row:
            sys.exit(f"plot_metrics: {path} line {n} has no 'step' key")
        rows.append(row)
    if not rows:
        sys.exit(f"plot_metrics: {path} is empty (no metrics lines)")
    return rows


def series(rows, key):
    """(steps, values) for the rows that have a finite value; a diverged loss is logged as null."""
    pts = [(r["step"], r.get(key)) for r in rows]
    pts = [(s, v) for s, v in pts if isinstance(v, (int, float)) and math.isfinite(v)]
    return [s for s, _ in pts], [v for _, v in pts]


def main():
    ap = argparse.ArgumentParser(description="Plot loss, learning rate and tokens/s from an mxtrain metrics JSONL.")
    ap.add_argument("metrics", help="metrics JSONL written by mxtrain")
    ap.add_argument("-o", "--output", default="metrics.png", help="PNG to write (default: metrics.png)")
    ap.add_argument("--validation", help="held-out loss JSONL (default: validation.jsonl beside the metrics, if any)")
    args = ap.parse_args()

    rows = read_rows(args.metrics)
    val_path = args.validation or os.path.join(os.path.dirname(args.metrics) or ".", "validation.jsonl")
    val_rows = read_rows(val_path) if args.validation or os.path.exists(val_path) else []
    try:
        import matplotlib
    except ImportError:
        sys.exit("plot_metrics: matplotlib is missing (Debian: apt-get install python3-matplotlib)")
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    panels = [("loss", "loss", "tab:blue"), ("lr", "learning rate", "tab:orange"),
              ("tokens_per_s", "tokens / s", "tab:green")]
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 9), sharex=True)
    for ax, (key, label, color) in zip(axes, panels):
        steps, values = series(rows, key)
        ax.plot(steps, values, color=color, marker="." if len(steps) < 50 else None)
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        if not steps:
            ax.text(0.5, 0.5, f"no '{key}' values", transform=ax.transAxes, ha="center", va="center")
        if key == "loss" and val_rows:
            vs, vv = series(val_rows, "val_loss")
            ax.plot(vs, vv, color="tab:red", marker="o", label="held-out")
            ax.plot([], [], color=color, label="training")
            ax.legend()
    axes[0].set_title(f"{args.metrics} ({len(rows)} steps logged)")
    axes[1].ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
    axes[-1].set_xlabel("step")
    fig.tight_layout()
    try:
        fig.savefig(args.output, dpi=100)
    except OSError as e:
        sys.exit(f"plot_metrics: cannot write {args.output}: {e.strerror}")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
