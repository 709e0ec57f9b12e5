"""Emulates the exact path's search (src/kernels/sample_search.cuh: histograms,
searchTotals, searchMerge with its lane-wise reach, the tie quotas) over
random rows split into chunks, for the record digits (6 a round) and the fine
digits (9, then 7), and checks both kept sets against the definition
(top-k by key then index, min-p by key, top-p: the mass before an index
below ceil(top_p * Z); top_p a float32 below 1, as decide() leaves it), for
equality, zero-mass indices included. Logic only, not the CUDA code."""
import math, random, sys
try:
    import numpy as np
except ImportError:
    print('exact_search_model: SKIPPED: numpy is missing (pip install numpy)')
    sys.exit(77)

M32 = 0xffffffff
KEY_NEG_INF = 0x007fffff


def order_keys(x):
    u = (x + np.float32(0)).view(np.uint32).astype(np.uint64)  # -0.0 + 0 is +0.0, as orderKey
    return np.where(u & 0x80000000, (~u) & M32, u | 0x80000000).astype(np.uint64)


def key_value(k):
    u = k & 0x7fffffff if k & 0x80000000 else (~k) & M32
    return float(np.array([u], dtype=np.uint32).view(np.float32)[0])


class Digits:
    def __init__(self, first, nxt):
        self.first, self.next = first, nxt
        self.bins = 1 << max(first, nxt)

    def top(self, r):
        return 32 if r == 0 else 32 - self.first - self.next * (r - 1)

    def of(self, r):
        hi = self.top(r)
        w = self.first if r == 0 else self.next
        sh = max(hi - w, 0)
        return sh, hi - sh

    def mask(self, r):
        hi = self.top(r)
        return 0 if hi >= 32 else (~((1 << hi) - 1)) & M32


def key_of_prefix(prefix, shift):
    return prefix if prefix & 0x80000000 else prefix | ((1 << shift) - 1)


def ceil_mass(p):
    if not (p >= 1.0):
        return 1
    return 9200000000000000000 if p >= 9.2e18 else math.ceil(p)


def quota_of(left, counts):
    q, before = [], 0
    for c in counts:
        rest = left - before if left > before else 0
        q.append(min(rest, c))
        before += c
    return q


def search(keys, masses, chunks, st, D, zb, mterm):
    """keys, masses: per chunk arrays; returns the final state."""
    tp = len(keys)
    while st['mode'] in ('K', 'P'):
        shift, width = D.of(st['round'])
        nb = 1 << width
        mask = D.mask(st['round'])
        rb = []
        tie_out = st['has_thr'] and not st['qall']
        for r in range(tp):
            k, m = keys[r], masses[r]
            sel = ((k & mask) == st['prefix']) & (k >= st['mpkey'])
            if st['mode'] == 'P':
                if st['has_thr']:
                    sel &= k >= st['tkey']
                if tie_out:
                    sel &= k != st['tkey']
            dig = ((k[sel] >> shift) & (nb - 1)).astype(np.int64)
            counted = st['mode'] == 'K' or shift <= zb  # P: counts, weighed per bin after
            w = np.ones(len(dig), dtype=object) if counted else m[sel]
            b = [0] * D.bins
            for d, v in zip(dig.tolist(), list(w)):
                b[d] += int(v)
            if st['mode'] == 'P' and counted:
                b = [c * mterm(key_of_prefix(st['prefix'] | (d << shift), shift)) if c else 0
                     for d, c in enumerate(b)]
            rb.append(b)
        tie_d, tie_m = -1, 0
        if st['mode'] == 'P' and st['has_thr'] and not st['qall'] and (st['tkey'] & mask) == st['prefix']:
            tie_m = mterm(st['tkey'])
            tie_d = (st['tkey'] >> shift) & (nb - 1)
        binr = lambda r, d: rb[r][d] + (st['quota'][r] * tie_m if d == tie_d else 0)
        h = [sum(binr(r, d) for r in range(tp)) for d in range(nb)]
        h += [0] * (D.bins - nb)
        # the lanes of reach
        bpl = D.bins // 32
        own = [sum(h[l * bpl:(l + 1) * bpl]) for l in range(32)]
        Sl = [sum(own[l:]) for l in range(32)]
        total = Sl[0]

        def reach(base, goal):
            best = None
            for l in range(32):
                d0 = bpl * l
                s = Sl[l] - own[l]
                for i in range(bpl - 1, -1, -1):
                    s += h[d0 + i]
                    d = d0 + i
                    if d >= 1 and d < nb and base + s >= goal:
                        best = (d, s, h[d])
                        break
            if best is None:
                return 0, h[0], total - h[0]
            d, s, hd = best
            return d, hd, s - hd

        if st['mode'] == 'K':
            need = st['need']
            if st['round'] == 0 and total < need:
                done, thr = True, False
            else:
                d, hd, above = reach(0, need)
                need -= above
                prefix = st['prefix'] | (d << shift)
                done = thr = hd == need or shift <= zb
                if thr:
                    qall = hd == need
                    st['has_thr'], st['qall'] = True, qall
                    st['tkey'] = prefix if qall else key_of_prefix(prefix, shift)
                    if not qall:
                        cs = [rb[r][d] for r in range(tp)]
                        st['quota'] = quota_of(need, cs)
                        st['whole'] = [q == c for q, c in zip(st['quota'], cs)]
                st['need'], st['prefix'] = need, prefix
            if done:
                st.update(mode='P' if st['topp_after'] else 'R', round=0, prefix=0, above=0)
            else:
                st['round'] += 1
            continue
        P = ceil_mass(st['top_p'] * float(total)) if st['round'] == 0 else st['P']
        above = 0 if st['round'] == 0 else st['above']
        d, hd, rel = reach(above, P)
        above += rel
        prefix = st['prefix'] | (d << shift)
        last = above + hd <= P or shift <= zb
        al = above + hd <= P
        st.update(P=P, above=above, prefix=prefix)
        if last:
            kone = key_of_prefix(prefix, shift)
            q = None
            if not al:
                m = mterm(kone)
                if m == 0:
                    al = True
                else:
                    cs = [binr(r, d) // m for r in range(tp)]
                    q = quota_of((P - above + m - 1) // m, cs)
                    # where the bin is the top-k threshold's key, c counts
                    # only the ties top-k kept: whole only if those were all
                    whole = [a == c and (d != tie_d or st['whole'][r])
                             for r, (a, c) in enumerate(zip(q, cs))]
            if not (al and st['has_thr'] and prefix <= st['tkey']):
                st.update(has_thr=True, tkey=prefix if al else kone, qall=al)
                if not al:
                    st['quota'], st['whole'] = q, whole
            st.update(mode='R', round=0)
        else:
            st['round'] += 1
    return st


def kept_of(keys, st):
    out = []
    for r, k in enumerate(keys):
        ok = k >= st['mpkey']
        if st['has_thr']:
            if st['qall']:
                ok = ok & (k >= st['tkey'])
            else:
                tie = ok & (k == st['tkey'])
                rank = np.cumsum(tie)
                # a part that keeps all its ties takes them without a cut
                keep_tie = tie if st['whole'][r] else tie & (rank <= st['quota'][r])
                ok = ok & ((k > st['tkey']) | keep_tie)
        out.append(ok)
    return np.concatenate(out)


def brute(key, mass, valid, k, top_p, mpkey):
    idx = np.nonzero(valid & (key >= mpkey))[0]
    order = sorted(idx.tolist(), key=lambda i: (-int(key[i]), i))
    if k is not None and k < len(order):
        order = order[:k]
    keep = np.zeros(len(key), dtype=bool)
    if top_p is None:
        keep[order] = True
        return keep
    Z = sum(int(mass[i]) for i in order)
    P = ceil_mass(top_p * float(Z))
    before = 0
    for i in order:
        if before < P:
            keep[i] = True
        before += int(mass[i])
    return keep


def make_row(rng, n, dtype, kind):
    if kind == 'flat':
        x = rng.normal(0, 0.05, n)
    elif kind == 'ties':
        x = rng.integers(-3, 4, n).astype(np.float64) * 0.5
        x[rng.random(n) < 0.1] = -0.0
    elif kind == 'wide':
        x = rng.normal(0, 8, n)
    else:  # realistic: a few high logits over a broad bulk
        x = rng.normal(0, 2.5, n)
        hot = rng.choice(n, size=rng.integers(1, 40), replace=False)
        x[hot] += rng.uniform(5, 15, len(hot))
    x = x.astype(np.float32)
    if dtype == 'bf16':
        x = (x.view(np.uint32) & 0xffff0000).view(np.float32)
    elif dtype == 'fp16':
        x = x.astype(np.float16).astype(np.float32)
    if rng.random() < 0.3:
        x[rng.choice(n, size=rng.integers(1, 5))] = -np.inf
    if rng.random() < 0.2:
        x[rng.choice(n, size=rng.integers(1, 3))] = np.nan
    return x


def main(trials, seed):
    rng = np.random.default_rng(seed)
    A, B = Digits(6, 6), Digits(9, 7)
    bad = 0
    for t in range(trials):
        dtype = rng.choice(['bf16', 'fp16', 'fp32'])
        zb = {'bf16': 16, 'fp16': 13, 'fp32': 0}[dtype]
        n = int(rng.integers(50, 4000))
        x = make_row(rng, n, dtype, rng.choice(['flat', 'ties', 'wide', 'real']))
        T = float(rng.choice([0.3, 0.7, 1.0, 1.5]))
        valid = ~np.isnan(x) & (x > -np.inf)
        key = order_keys(x)
        xmax = float(np.max(x[valid]))
        with np.errstate(over='ignore', invalid='ignore'):
            mass = np.where(valid, np.floor(np.exp((x.astype(np.float64) - xmax) / T) * 2.0**40), 0)
        mass = [int(v) for v in mass]
        mterm = lambda kk: int(math.floor(math.exp((key_value(kk) - xmax) / T) * 2.0**40))
        mpkey = KEY_NEG_INF + 1
        if rng.random() < 0.3:
            mpkey = int(np.sort(key[valid])[int(rng.integers(0, valid.sum()))])
        # k and top_p at the edges: k = the count of the keys at or above one
        # of the row's keys (a bin's edge in some round), top_p = the mass at
        # or above one (the bound P lands on it, or next to it)
        vk = np.sort(key[valid & (key >= mpkey)])[::-1]
        k = None
        if rng.random() < 0.6:
            k = int(rng.integers(1, n + 20))
            if rng.random() < 0.5:
                j = int(rng.integers(0, len(vk)))
                k = int((vk >= vk[j]).sum()) + int(rng.integers(-1, 2))
                k = max(k, 1)
        top_p = None
        if rng.random() < 0.8:
            top_p = float(rng.choice([0.5, 0.9, 0.99, 0.999, rng.random()]))
            if rng.random() < 0.4:
                kept = [i for i in np.nonzero(valid & (key >= mpkey))[0].tolist()]
                kept.sort(key=lambda i: (-int(key[i]), i))
                if k is not None:
                    kept = kept[:k]
                ms = [mass[i] for i in kept]
                Z = sum(ms)
                j = int(rng.integers(0, len(ms)))
                top_p = min(1.0, max(1e-9, sum(ms[:j + 1]) / Z)) if Z else 0.5
            top_p = float(np.float32(top_p))  # the kernels take (double) of a float
            if top_p >= 1.0:
                top_p = None  # decide() turns top-p off
        if k is None and top_p is None:
            top_p = 0.9
        key = np.where(valid, key, 0).astype(np.uint64)  # invalid: below every threshold
        res = []
        for D in (A, B):
            tp = int(rng.integers(1, 9))
            cuts = sorted(rng.choice(np.arange(1, n), size=tp - 1, replace=False).tolist()) if tp > 1 else []
            bounds = [0] + cuts + [n]
            keys = [key[bounds[r]:bounds[r + 1]] for r in range(tp)]
            masses = [np.array(mass[bounds[r]:bounds[r + 1]], dtype=object) for r in range(tp)]
            st = dict(mode='K' if k is not None else 'P', round=0, has_thr=False, qall=False,
                      topp_after=top_p is not None, prefix=0, tkey=0, mpkey=mpkey,
                      need=k if k is not None else 0, above=0, P=0, top_p=top_p, quota=[0] * 8,
                      whole=[False] * 8)
            # K's and P's histograms leave out invalid entries: key 0 < mpkey
            st = search(keys, masses, bounds, st, D, zb, mterm)
            res.append(kept_of(keys, st) & valid)
        want = brute(key, np.array(mass, dtype=object), valid, k, top_p, mpkey)
        for name, got in zip('AB', res):
            if not np.array_equal(got, want):
                bad += 1
                print('MISMATCH', name, t, dtype, n, k, top_p, int((got != want).sum()))
    print(f'trials {trials}: mismatches {bad}')
    return bad


if __name__ == '__main__':
    sys.exit(1 if main(int(sys.argv[1]) if len(sys.argv) > 1 else 300,
                       int(sys.argv[2]) if len(sys.argv) > 2 else 1) else 0)
