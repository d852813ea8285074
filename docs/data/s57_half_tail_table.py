# Session 57: median ms of the CTA-pair grouped GEMM (sm90 128x256 c2) per MXTRAIN_GG_HALF_TAIL setting, from the
# unpacked logs of docs/data/s57_call1_logs.tgz and s57_call2_logs.tgz: python3 s57_half_tail_table.py DIR1 DIR2
import glob, re, sys, collections, statistics as st
rows = collections.defaultdict(list)
for d in sys.argv[1:]:
    for f in sorted(glob.glob(d + "/gg_*.txt")):
        name = f.split("/")[-1][3:-4]
        m = re.match(r"(.*)_(off|on|last)(\d+)$", name)
        shape, h = m.group(1), m.group(2)
        shape = {"mb1": "8x7B-mb1", "full": "8x7B"}.get(shape, shape)
        for line in open(f):
            c = [x.strip() for x in line.split("|")]
            if len(c) > 5 and c[3] in ("sm90 128x256 c2", "sm90 128x256 c2, alternating with dense"):
                rows[(shape, " ".join(c[2].split()), c[3], h)].append(float(c[4]))
keys = sorted(set(k[:3] for k in rows))
for k in keys:
    out = []
    for h in ("off", "on", "last"):
        v = rows.get(k + (h,))
        if v: out.append(f"{h} n={len(v)} med {st.median(v):.3f} mean {st.mean(v):.3f}")
    off = rows.get(k + ("off",)); last = rows.get(k + ("last",))
    r = f"last/off median {st.median(last)/st.median(off):.4f}" if off and last else ""
    print(f"{k[0]:9} {k[1]:15} {k[2][:20]:20} | " + " | ".join(out) + " | " + r)
print()
for k in keys:
    if k[2] != "sm90 128x256 c2": continue
    print(k[0], k[1], {h: rows.get(k + (h,)) for h in ("off", "on", "last")})
