#!/usr/bin/env python3
"""Warp-stall samples by SASS opcode, from Nsight Compute's per-instruction export
(`ncu --import R.ncu-rep --page source --csv --print-source sass > R_sass.csv`, as device_dist_checks.sh's ncu
sections write it; .gz is read too). One file: each opcode's samples and share, and its top stall reasons. Two
files A B: the opcodes whose samples differ most, A - B, e.g. a kernel against the same kernel with its epilogue
left out (MXTRAIN_GG_FAULT=noepi), which says where the epilogue's time goes.

    python3 scripts/ncu_sass_ops.py A_sass.csv [B_sass.csv] [--top N]

Only the first kernel in each file is read. Opcodes keep their modifiers (BAR.SYNC.DEFER_BLOCKING); a predicate
(@P0) is dropped.
"""
import argparse
import collections
import csv
import gzip
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"


def read_rows(path):
    """The per-instruction rows of the file's first kernel, as dicts."""
    opener = gzip.open if path.endswith(".gz") else open
    rows, header, kernels = [], None, 0
    with opener(path, "rt", newline="") as f:
        for row in csv.reader(f):
            if row and row[0] == "Kernel Name":
                kernels += 1
                if kernels > 1:
                    break
                header = None
            elif row and row[0] == "Address":
                header = row
            elif header and len(row) == len(header):
                rows.append(dict(zip(header, row)))
    if not rows or SAMPLES not in rows[0]:
        sys.exit(f"ncu_sass_ops.py: {path}: no per-instruction rows with '{SAMPLES}' (an ncu --page source "
                 "--csv --print-source sass export?)")
    return rows


def by_opcode(rows):
    """samples per opcode, and per opcode a Counter of its stall reasons' samples."""
    total, reasons = collections.Counter(), collections.defaultdict(collections.Counter)
    for d in rows:
        words = d.get("Source", "").split()
        if not words:
            continue
        op = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
        total[op] += int(d[SAMPLES] or 0)
        for key, value in d.items():
            if key.startswith("stall_") and "Not Issued" not in key and value:
                reasons[op][key[len("stall_"):]] += int(value)
    return total, reasons


def top_reasons(counter, n=3):
    return ", ".join(f"{k} {v}" for k, v in counter.most_common(n) if v)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+", metavar="SASS_CSV")
    ap.add_argument("--top", type=int, default=20)
    args = ap.parse_args()
    if len(args.files) > 2:
        ap.error("one file, or two to subtract")
    a, ra = by_opcode(read_rows(args.files[0]))
    if len(args.files) == 1:
        n = sum(a.values()) or 1
        print(f"samples: {sum(a.values())}")
        print("| opcode | samples | share | top stall reasons |")
        print("| --- | --- | --- | --- |")
        for op, s in a.most_common(args.top):
            print(f"| {op} | {s} | {100 * s / n:.1f}% | {top_reasons(ra[op])} |")
        return
    b, rb = by_opcode(read_rows(args.files[1]))
    print(f"samples: {sum(a.values())} - {sum(b.values())} = {sum(a.values()) - sum(b.values()):+d}")
    print("| opcode | A | B | A - B | top stall reasons of A - B |")
    print("| --- | --- | --- | --- | --- |")
    ops = sorted(set(a) | set(b), key=lambda op: -abs(a[op] - b[op]))
    for op in ops[:args.top]:
        diff = collections.Counter({k: ra[op][k] - rb[op][k] for k in ra[op]})
        print(f"| {op} | {a[op]} | {b[op]} | {a[op] - b[op]:+d} | {top_reasons(diff)} |")


if __name__ == "__main__":
    main()
