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

def simulate(per, K, pieces, C_mb, D, serp=False, seed=1):
    """DRAM bytes (GB) of the CTAs' (or pairs') item lists `per` of K k-blocks each, under an LRU of C_mb MB: each
    runs a lag drawn below D k-blocks behind the front; pieces(item, k) lists the (key, bytes) read per k-block."""
    rnd = random.Random(seed)
    lag = [rnd.randrange(D) if D > 0 else 0 for _ in per]
    cap = C_mb * 2**20
    lru = collections.OrderedDict(); used = 0; dram = 0
    for t in range(max(len(items) * K + l for items, l in zip(per, lag))):
        for items, l in zip(per, lag):
            q = t - l
            if q < 0 or q >= len(items) * K: continue
            j, k = divmod(q, K)
            if serp and j % 2: k = K - 1 - k
            for key, size in pieces(items[j], k):
                if key in lru:
                    lru.move_to_end(key); continue
                dram += size; lru[key] = size; used += size
                while used > cap:
                    _, s = lru.popitem(last=False); used -= s
    return dram / 1e9

def run(C_mb, D, g, serp, pairs=66, K=136, experts=8):
    """The trainer's W13 call in CTA pairs over m: a pair reads its two m-tiles' dh13 pieces and one shared x piece."""
    items = [(e, n, mp) for e in range(experts) for (n, mp) in units(g)]
    pieces = lambda it, k: ((('x', it[0], it[1], k), 32 << 10), (('d', it[0], 2 * it[2], k), 16 << 10),
                            (('d', it[0], 2 * it[2] + 1, k), 16 << 10))
    return simulate([items[p::pairs] for p in range(pairs)], K, pieces, C_mb, D, serp)

def run_one_cta(C_mb, D, K=136, experts=8, ctas=132):
    """The same call with one CTA per (m-tile, n-tile) unit (no pairs): each reads its dh13 and x pieces."""
    items = [(e, n, m) for e in range(experts) for m in range(224) for n in range(16)]  # n fast
    pieces = lambda it, k: ((('x', it[0], it[1], k), 32 << 10), (('d', it[0], it[2], k), 16 << 10))
    return simulate([items[c::ctas] for c in range(ctas)], K, pieces, C_mb, D)

def run_fwd(C_mb, D, pairs=66, experts=8, mt=9, n_tiles=112, K=64):
    """The forward W13 per micro-batch: per expert mt m-tiles (pairs of them, m fast) x n_tiles W13 n-tiles, K
    k-blocks; per k-block a pair reads two 16 KB x pieces and one shared 32 KB W piece."""
    items = [(e, mp, n) for e in range(experts) for n in range(n_tiles) for mp in range((mt + 1) // 2)]
    pieces = lambda it, k: ((('w', it[0], it[2], k), 32 << 10), (('x', it[0], 2 * it[1], k), 16 << 10),
                            (('x', it[0], 2 * it[1] + 1, k), 16 << 10))
    return simulate([items[p::pairs] for p in range(pairs)], K, pieces, C_mb, D)

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
