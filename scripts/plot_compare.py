#!/usr/bin/python3
"""Overlay the loss curves of several mxtrain runs (metrics.jsonl files: one JSON object per step with "step"
and "loss"), one panel per group, plus the relative difference of each run to the first of its group.

usage: plot_compare.py -o out.png "TITLE:label=metrics.jsonl,label=metrics.jsonl" ["TITLE:..." ...]

Needs matplotlib (Debian: python3-matplotlib).
"""
import argparse
import json
import sys


def read_losses(path):
    steps, losses = [], []
    try:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    steps.append(int(row["step"]))
                    losses.append(float(row["loss"]))
                except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
                    sys.exit(f"plot_compare: {path} line {n}: no step/loss ({e})")
    except OSError as e:
        sys.exit(f"plot_compare: cannot read {path}: {e.strerror}")
    if not steps:
        sys.exit(f"plot_compare: {path} holds no steps")
    return steps, losses


def parse_group(spec):
    if ":" not in spec:
        sys.exit(f"plot_compare: '{spec}' is not TITLE:label=path,...")
    title, runs = spec.split(":", 1)
    out = []
    for item in runs.split(","):
        if "=" not in item:
            sys.exit(f"plot_compare: '{item}' is not label=path")
        label, path = item.split("=", 1)
        out.append((label, *read_losses(path)))
    return title, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("groups", nargs="+")
    ap.add_argument("-o", "--out", required=True)
    a = ap.parse_args()
    groups = [parse_group(g) for g in a.groups]
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(groups), figsize=(6 * len(groups), 7), squeeze=False,
                             gridspec_kw={"height_ratios": [3, 1]})
    for col, (title, runs) in enumerate(groups):
        top, bottom = axes[0][col], axes[1][col]
        for label, steps, losses in runs:
            top.plot(steps, losses, label=label, linewidth=1)
        top.set_title(title)
        top.set_ylabel("loss")
        top.legend()
        top.grid(alpha=0.3)
        ref = dict(zip(runs[0][1], runs[0][2]))
        for label, steps, losses in runs[1:]:
            pts = [(s, (l - ref[s]) / ref[s]) for s, l in zip(steps, losses) if s in ref]
            bottom.plot([p[0] for p in pts], [p[1] for p in pts], label=f"({label} - {runs[0][0]}) / {runs[0][0]}",
                        linewidth=0.8)
        bottom.axhline(0, color="black", linewidth=0.5)
        bottom.set_xlabel("step")
        bottom.set_ylabel("relative difference")
        bottom.legend(fontsize=8)
        bottom.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)
    print(f"plot_compare: wrote {a.out}")


if __name__ == "__main__":
    main()
