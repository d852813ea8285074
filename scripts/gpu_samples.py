#!/usr/bin/env python3
"""SM clock and board power while each run of a bench_trainer.py call was busy.

Sample the GPU beside the benchmark, then summarise over each row's mxtrain and HF windows:

  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_event_reasons.active --format=csv,noheader \\
      -lms 200 > smi.csv &
  python3 scripts/bench_trainer.py --out DIR ...; kill %1
  python3 scripts/gpu_samples.py smi.csv DIR/bench.jsonl

`gpu_samples.py run SAMPLES.csv -- CMD ARGS` samples while CMD runs and reports over the JSON lines it prints.
The second file may also hold bench_grouped_gemm --sustain's lines ({"name", "window"}: one kernel held for
seconds), read the same way (other lines of its output are skipped).

bench_trainer.py --sample-gpu does both steps itself. The sample file may be gzipped (.gz). Timestamps are read in
the local time zone, as nvidia-smi writes them: summarise on the machine that sampled, or under the same TZ.
Only samples drawing more than --busy-watts count (start-up, weight init and model loading draw far less), so the
figures describe the training steps. Prints, per run: busy samples, median SM clock (MHz), median and max power
(W), and the share of busy samples whose clock-event mask reports the software power cap (0x4).
"""
import argparse, datetime, gzip, json, statistics, sys


QUERY = "timestamp,clocks.sm,power.draw,{reasons}"


def reasons_field():
    """The clock-event mask's query name: clocks_event_reasons in current drivers, clocks_throttle_reasons before."""
    import subprocess
    for f in ("clocks_event_reasons.active", "clocks_throttle_reasons.active"):
        if subprocess.run(["nvidia-smi", f"--query-gpu={f}", "--format=csv"], capture_output=True).returncode == 0:
            return f
    return None


def start_sampler(path, interval_ms=200):
    """nvidia-smi writing a sample every interval_ms to path; None where there is no nvidia-smi."""
    import shutil, subprocess
    if not shutil.which("nvidia-smi"):
        return None
    reasons = reasons_field()
    query = QUERY.format(reasons=reasons) if reasons else "timestamp,clocks.sm,power.draw"
    return subprocess.Popen(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader", "-lms", str(interval_ms)],
                            stdout=open(path, "w"), stderr=subprocess.STDOUT)


def parse_samples(path):
    out = []
    opener = gzip.open if path.endswith(".gz") else open
    for line in opener(path, "rt"):
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


def report(samples_path, rows, busy_watts=300.0):
    samples = parse_samples(samples_path)
    print("| run | busy samples | SM clock MHz (median) | power W (median / max) | power-capped share |")
    print("|---|---|---|---|---|")
    printed = 0
    for row in rows:
        if "window" in row:  # bench_grouped_gemm --sustain: one kernel's window
            windows = [(row["name"], row["window"])]
        else:
            name = row["preset"] + (" " + " ".join(row.get("overrides") or []) if row.get("overrides") else "")
            windows = [(f"{name} {who}", row.get(key)) for who, key in (("mxtrain", "mxtrain_wall"), ("HF", "hf_wall"))]
        for label, window in windows:
            lo, hi = window or (0, 0)
            busy = [s for s in samples if lo <= s[0] <= hi and s[2] > busy_watts]
            if not busy:
                continue
            capped = sum(1 for s in busy if s[3] & 0x4) / len(busy)
            print(f"| {label} | {len(busy)} | {statistics.median(s[1] for s in busy):.0f} | "
                  f"{statistics.median(s[2] for s in busy):.0f} / {max(s[2] for s in busy):.0f} | {capped:.0%} |")
            printed += 1
    if not printed:
        sys.stderr.write(f"gpu_samples: no sample above {busy_watts:.0f} W inside any run's window ({len(samples)} samples "
                         "read): were they taken during these runs, and in this time zone (TZ)?\n")


def run_sampled(samples_path, cmd):
    """Runs cmd with the sampler on, echoing its output; then reports over the JSON lines it printed."""
    import subprocess
    sampler = start_sampler(samples_path, 100)
    if sampler is None:
        sys.stderr.write("gpu_samples: no nvidia-smi on PATH, nothing sampled\n")
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if sampler is not None:
        sampler.terminate()
        sampler.wait()
    sys.stdout.write(proc.stdout)
    rows = [json.loads(l) for l in proc.stdout.splitlines() if l.startswith("{")]
    if sampler is not None:
        print()
        report(samples_path, rows)
    return proc.returncode


def main():
    # gpu_samples.py run SAMPLES.csv -- CMD...: sample while CMD runs (bench_grouped_gemm --sustain), then report
    if len(sys.argv) > 3 and sys.argv[1] == "run" and sys.argv[3] == "--":
        sys.exit(run_sampled(sys.argv[2], sys.argv[4:]))
    ap = argparse.ArgumentParser()
    ap.add_argument("samples")
    ap.add_argument("bench_jsonl")
    ap.add_argument("--busy-watts", type=float, default=300.0)
    a = ap.parse_args()
    report(a.samples, [json.loads(l) for l in open(a.bench_jsonl) if l.startswith("{")], a.busy_watts)


if __name__ == "__main__":
    main()
