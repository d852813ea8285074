"""LRU model of the trainer's W13 expert weight-gradient call's operand reads (session 52, no device lent).

The call: 8 experts, K = 136 k-blocks of 64 rows per expert (8 micro-batches of ~1,024 rows each), dW13[e] =
dh13_e^T x_e of [28672, 4096]: 224 m-tiles of 128 dh13 columns, 16 n-tiles of 256 x columns; CTA pairs over m
(a pair: 2 m-tiles, one n-tile, x shared by multicast), 66 pairs, units n-fast (wgrad_unit, raster group g).
Each k-block a CTA reads a 16 KB dh13 piece (its m-tile) and the pair a 32 KB x piece (its n-tile). A piece read
from DRAM is counted once until the LRU (capacity C) evicts it. Drift: pair p runs `lag[p]` k-blocks behind the
front (drawn uniformly in [0, D)), or, with serpentine, odd item ordinals walk k backwards.
Session 52's table: `--experts 2 --drift 0 32 68 136 200`, the same with `--one-cta`, `--serp 1`, `--group 8`;
`--forward --drift 0 64 128 256` (2 of 8 experts, scaled: the experts are alike)."""
import argparse, collections, random

def units(g, nf=16, ns=112):
    if g <= 0 or g > nf: g = nf
    out = []
    for local in range(nf * ns):
        block = g * ns; gi = local // block; full = nf // g
        w = g if gi < full else nf - full * g
        r = local - gi * block
        out.append((gi * g + r % w, r // w))  # (fast = n, slow = m-pair)
    return out

def run(C_mb, D, g, serp, pairs=66, E=8, K=136, seed=1, experts=8):
    rnd = random.Random(seed)
    us = units(g)
    items = [(e, n, mp) for e in range(experts) for (n, mp) in us]
    per = [items[p::pairs] for p in range(pairs)]
    lag = [rnd.randrange(D) if D > 0 else 0 for _ in range(pairs)]
    cap = C_mb * 2**20
    lru = collections.OrderedDict(); used = 0; dram = 0
    T = max(len(per[p]) * K + lag[p] for p in range(pairs))
    def touch(key, size):
        nonlocal used, dram
        if key in lru:
            lru.move_to_end(key); return
        dram += size; lru[key] = size; used += size
        while used > cap:
            _, s = lru.popitem(last=False); used -= s
    for t in range(T):
        for p in range(pairs):
            q = t - lag[p]
            if q < 0 or q >= len(per[p]) * K: continue
            j, k = divmod(q, K)
            if serp and j % 2: k = K - 1 - k
            e, n, mp = per[p][j]
            touch(('x', e, n, k), 32 << 10)
            touch(('d', e, 2 * mp, k), 16 << 10)
            touch(('d', e, 2 * mp + 1, k), 16 << 10)
    return dram / 1e9

def run_one_cta(C_mb, D, K=136, experts=8, ctas=132, seed=1):
    """The same call with one CTA per (m-tile, n-tile) unit (no pairs): each reads its dh13 and x pieces."""
    rnd = random.Random(seed)
    items = [(e, n, m) for e in range(experts) for m in range(224) for n in range(16)]  # n fast
    per = [items[c::ctas] for c in range(ctas)]
    lag = [rnd.randrange(D) if D > 0 else 0 for _ in range(ctas)]
    cap = C_mb * 2**20
    lru = collections.OrderedDict(); used = 0; dram = 0
    T = max(len(per[c]) * K + lag[c] for c in range(ctas))
    for t in range(T):
        for c in range(ctas):
            q = t - lag[c]
            if q < 0 or q >= len(per[c]) * K: continue
            j, k = divmod(q, K)
            e, n, m = per[c][j]
            for key, size in ((('x', e, n, k), 32 << 10), (('d', e, m, k), 16 << 10)):
                if key in lru: lru.move_to_end(key); continue
                dram += size; lru[key] = size; used += size
                while used > cap:
                    _, s = lru.popitem(last=False); used -= s
    return dram / 1e9

def run_fwd(C_mb, D, pairs=66, experts=8, mt=9, n_tiles=112, K=64, seed=1):
    """The forward W13 per micro-batch: per expert mt m-tiles (pairs of them, m fast) x n_tiles W13 n-tiles, K
    k-blocks; per k-block a pair reads two 16 KB x pieces and one shared 32 KB W piece."""
    rnd = random.Random(seed)
    groups = (mt + 1) // 2
    items = [(e, mp, n) for e in range(experts) for n in range(n_tiles) for mp in range(groups)]
    per = [items[p::pairs] for p in range(pairs)]
    lag = [rnd.randrange(D) if D > 0 else 0 for _ in range(pairs)]
    cap = C_mb * 2**20
    lru = collections.OrderedDict(); used = 0; dram = 0
    T = max(len(per[p]) * K + lag[p] for p in range(pairs))
    for t in range(T):
        for p in range(pairs):
            q = t - lag[p]
            if q < 0 or q >= len(per[p]) * K: continue
            j, k = divmod(q, K)
            e, mp, n = per[p][j]
            for key, size in ((('w', e, n, k), 32 << 10), (('x', e, 2 * mp, k), 16 << 10), (('x', e, 2 * mp + 1, k), 16 << 10)):
                if key in lru: lru.move_to_end(key); continue
                dram += size; lru[key] = size; used += size
                while used > cap:
                    _, s = lru.popitem(last=False); used -= s
    return dram / 1e9


if __name__ == '__main__':
    ap = argparse.ArgumentParser()
    ap.add_argument('--cap', type=float, default=50)
    ap.add_argument('--drift', type=int, nargs='+', default=[0])
    ap.add_argument('--group', type=int, nargs='+', default=[0])
    ap.add_argument('--serp', type=int, nargs='+', default=[0])
    ap.add_argument('--experts', type=int, default=8)
    ap.add_argument('--one-cta', action='store_true', help='one CTA per unit instead of pairs')
    ap.add_argument('--forward', action='store_true', help='the forward W13 of one micro-batch instead')
    a = ap.parse_args()
    if a.one_cta or a.forward:
        for D in a.drift:
            gb = run_one_cta(a.cap, D, experts=a.experts) * 8 / a.experts if a.one_cta else run_fwd(a.cap, D)
            print(f"{'one CTA' if a.one_cta else 'forward'} cap {a.cap} MB drift<{D}: {gb:.1f} GB", flush=True)
        raise SystemExit
    for g in a.group:
        for s in a.serp:
            for D in a.drift:
                gb = run(a.cap, D, g, s, experts=a.experts)
                print(f"cap {a.cap} MB group {g} serp {s} drift<{D}: {gb * 8 / a.experts:.1f} GB (scaled to 8 experts)", flush=True)
