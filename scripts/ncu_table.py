#!/usr/bin/env python3
"""One row per Nsight Compute launch: cycles, tensor pipe, L2 and DRAM traffic, from `ncu --page raw --csv` files
(a file's second launch labelled LABEL#2, and so on).

    python3 scripts/ncu_table.py "label=run_raw.csv" ...

Besides the raw figures it prints the least number of SM cycles the L2 needs for the launch's reduce sectors alone
(ncu's peak: one per L2 cycle per slice): a lower bound on a weight-gradient epilogue that adds fp32 tiles into dW
while nothing else runs (docs/perf.md, session 41).
"""
import csv
import sys


def load(path):
    """One metric reader per launch in the file (a cuBLASLt call may launch more than one kernel)."""
    rows = list(csv.reader(open(path)))
    if len(rows) < 3:
        sys.exit(f"ncu_table.py: {path}: no launch in it (was the kernel matched?)")
    units = dict(zip(rows[0], rows[1]))

    def reader(row):
        vals = dict(zip(rows[0], row))

        def num(name, unit_scale=None):
            if name not in vals:
                sys.exit(f"ncu_table.py: {path}: no metric {name} (profile with --set full)")
            v = float(vals[name].replace(",", ""))
            return v * unit_scale.get(units[name], 1.0) if unit_scale else v

        return num

    return [reader(row) for row in rows[2:] if row]


GB = {"byte": 1e-9, "Kbyte": 1e-6, "Mbyte": 1e-3, "Gbyte": 1.0, "Tbyte": 1e3}


def main(args):
    if not args or any("=" not in a for a in args):
        sys.exit("usage: ncu_table.py label=raw.csv ...")
    runs = []
    for label, path in (a.split("=", 1) for a in args):
        launches = load(path)
        runs += [(label if i == 0 else f"{label}#{i + 1}", num) for i, num in enumerate(launches)]
    print("| kernel | SM cycles (M) | SM GHz | tensor pipe active % | L2 sector throughput % | L2 read GB | "
          "L2 reduce GB | L2 reduce alone, least SM cycles (M) | TMA bytes into SMs GB | DRAM read / write GB |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for label, num in runs:
        cycles = num("gpc__cycles_elapsed.max")
        slices = num("lts__cycles_elapsed.sum") / num("lts__cycles_elapsed.avg")
        l2_per_sm_cycle = num("lts__cycles_elapsed.avg") / cycles
        red = num("lts__t_sectors_srcunit_tex_op_red.sum")
        red_peak = num("lts__t_sectors_srcunit_tex_op_red.avg.peak_sustained")  # per L2 cycle and slice
        red_min = red / (slices * red_peak) / l2_per_sm_cycle
        print(f"| {label} | {cycles / 1e6:.2f} | {num('gpc__cycles_elapsed.max.per_second'):.2f} | "
              f"{num('sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed'):.1f} | "
              f"{num('lts__t_sectors_srcunit_tex.avg.pct_of_peak_sustained_elapsed'):.1f} | "
              f"{num('lts__t_sectors_srcunit_tex_op_read.sum') * 32e-9:.1f} | {red * 32e-9:.2f} | "
              f"{red_min / 1e6:.2f} | {num('l1tex__m_xbar2l1tex_read_bytes.sum', GB):.1f} | "
              f"{num('dram__bytes_read.sum', GB):.2f} / {num('dram__bytes_write.sum', GB):.2f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
