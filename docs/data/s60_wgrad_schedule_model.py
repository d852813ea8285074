#!/usr/bin/env python3
"""Session 60: the single-call weight gradient's static schedule at bench_grouped_gemm's 8x7B shape (16,384 rows over
8 experts, the bench's load multipliers), W13 against W2. A model, not a measurement: items in expert order, each
costing its expert's k-blocks plus `epi` k-blocks of epilogue; CTA pair c runs items c, c + 66, ... (the kernel's
schedule), or, dynamic, the free pair takes the next item; session 61: static with the experts by decreasing
k-blocks (MXTRAIN_GG_WGRAD_ORDER=rows). Prints the busiest pair's work over the mean.
    python3 docs/data/s60_wgrad_schedule_model.py
"""
import heapq
import math

MULT = [1.30, 0.70, 1.15, 0.85, 1.05, 0.95, 1.25, 0.75]  # tests/bench/bench_grouped_gemm.cpp
PAIRS = 66  # 132 SMs in CTA pairs
rows = [round(2048 * m) for m in MULT[:-1]]
rows.append(16384 - sum(rows))
nk = [math.ceil(r / 64) for r in rows]
# Pair units per expert, pairs over m-tiles of 128 x 256 tiles: W13 dW is 28,672 x 4,096, W2 dW 4,096 x 14,336.
UNITS = {"W13": 28672 // 256 * 4096 // 256, "W2": 4096 // 256 * 14336 // 256}
print("rows", rows, "k-blocks", nk)
print("| call | pair units per expert | rounds | epilogue (k-blocks) | static: busiest / mean | dynamic "
      "| static, experts by rows |")
print("| --- | --- | --- | --- | --- | --- | --- |")


def item_costs(order, units, epi):
    return [nk[e] + epi for e in order for _ in range(units)]


def static(order, units, epi):
    costs = item_costs(order, units, epi)
    busy = [0] * PAIRS
    for i, c in enumerate(costs):
        busy[i % PAIRS] += c
    return max(busy) / (sum(costs) / PAIRS)


by_rows = sorted(range(8), key=lambda e: (-nk[e], e))
for name, units in UNITS.items():
    for epi in (0, 4):
        costs = item_costs(range(8), units, epi)
        heap = [(0, p) for p in range(PAIRS)]
        for c in costs:
            t, p = heapq.heappop(heap)
            heapq.heappush(heap, (t + c, p))
        mean = sum(costs) / PAIRS
        print(f"| {name} | {units} | {len(costs) / PAIRS:.1f} | {epi} | {static(range(8), units, epi):.4f} | "
              f"{max(t for t, _ in heap) / mean:.4f} | {static(by_rows, units, epi):.4f} |")
