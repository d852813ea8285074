#!/usr/bin/env python3
"""SM clock and board power while each run of a bench_trainer.py call was busy.

Sample the GPU beside the benchmark, then summarise over each row's mxtrain and HF windows:

  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_event_reasons.active --format=csv,noheader \\
      -lms 200 > smi.csv &
  python3 scripts/bench_trainer.py --out DIR ...; kill %1
  python3 scripts/gpu_samples.py smi.csv DIR/bench.jsonl

Only samples drawing more than --busy-watts count (start-up, weight init and model loading draw far less), so the
figures describe the training steps. Prints, per run: busy samples, median SM clock (MHz), median and max power
(W), and the share of busy samples whose clock-event mask reports the software power cap (0x4).
"""
import argparse, datetime, json, statistics


def parse_samples(path):
    out = []
    for line in open(path):
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 3:
            continue
        try:
            t = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            mhz = float(parts[1].split()[0])
            watts = float(parts[2].split()[0])
        except ValueError:
            continue
        mask = int(parts[3], 16) if len(parts) > 3 and parts[3].startswith("0x") else 0
        out.append((t, mhz, watts, mask))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("samples")
    ap.add_argument("bench_jsonl")
    ap.add_argument("--busy-watts", type=float, default=300.0)
    a = ap.parse_args()
    samples = parse_samples(a.samples)
    print("| run | busy samples | SM clock MHz (median) | power W (median / max) | power-capped share |")
    print("|---|---|---|---|---|")
    for line in open(a.bench_jsonl):
        row = json.loads(line)
        name = row["preset"] + (" " + " ".join(row.get("overrides") or []) if row.get("overrides") else "")
        for who, key in (("mxtrain", "mxtrain_wall"), ("HF", "hf_wall")):
            lo, hi = row.get(key) or (0, 0)
            busy = [s for s in samples if lo <= s[0] <= hi and s[2] > a.busy_watts]
            if not busy:
                continue
            capped = sum(1 for s in busy if s[3] & 0x4) / len(busy)
            print(f"| {name} {who} | {len(busy)} | {statistics.median(s[1] for s in busy):.0f} | "
                  f"{statistics.median(s[2] for s in busy):.0f} / {max(s[2] for s in busy):.0f} | {capped:.0%} |")


if __name__ == "__main__":
    main()
