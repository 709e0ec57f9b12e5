#!/usr/bin/env python3
"""The nuclei of dps-perf's sample_p rows, on the host (numpy only).

Rebuilds the rows of tools/dps-perf/op_sample.c (the bulk: 2.5 x the N(0,1)
quantile at (i + 1/2) / 2^16 in bf16, picked per (row, col, step) by
murmur3's finalizer; 1-4 head tokens at 10..20) and prints, for top-p at
temperature T, the size of each row's nucleus (keep an index iff the mass
before it, in the order value descending / index ascending, is below
top_p) and the share of rows whose nucleus a candidate list of B tokens
would hold. docs/performance.md, session 28, has one run's output.

usage: bench/nucleus_sizes.py [rows=256] [V=152064] [T=0.7] [top_p=0.9] [step=1]
"""
import sys
from math import erfc, sqrt

import numpy as np

M64 = (1 << 64) - 1
K1, K2, K3 = 0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9


def mix64(x):
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & M64
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & M64
    return x ^ (x >> 33)


def hash3(a, b, c):
    return mix64((a * K1 + b * K2 + c * K3) & M64)


def mix64v(x):
    s = np.uint64(33)
    x = x ^ (x >> s)
    x = x * np.uint64(0xFF51AFD7ED558CCD)
    x = x ^ (x >> s)
    x = x * np.uint64(0xC4CEB9FE1A85EC53)
    return x ^ (x >> s)


def bf16(x):
    """float32 -> bf16 (round to nearest even) -> float32."""
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    r = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) << 16
    return r.astype(np.uint32).view(np.float32)


def bulk_table(n=1 << 16):
    u = (np.arange(n) + 0.5) / n
    lo, hi = np.full(n, -10.0), np.full(n, 10.0)
    phi = np.vectorize(lambda x: 0.5 * erfc(-x / sqrt(2.0)))
    for _ in range(60):  # the quantile by bisection, as op_sample.c
        mid = 0.5 * (lo + hi)
        less = phi(mid) < u
        lo, hi = np.where(less, mid, lo), np.where(less, hi, mid)
    return bf16((2.5 * 0.5 * (lo + hi)).astype(np.float32))


def row_values(bulk, r, step, V):
    cols = np.arange(V, dtype=np.uint64)
    with np.errstate(over="ignore"):
        h = mix64v(np.uint64((r * K1 + step * K2) & M64) + cols * np.uint64(K3))
    row = bulk[(h & np.uint64(len(bulk) - 1)).astype(np.int64)].astype(np.float64)
    for i in range(1 + hash3(r, step, 0x4EAD) % 4):
        x = hash3(r, step, 0x100 + i)
        val = float(bf16(np.float32(10.0 + 10.0 * ((x >> 40) & 0xFFFFFF) / 16777216.0)))
        row[x % V] = max(row[x % V], val)
    return row


def main():
    a = sys.argv[1:]
    rows = int(a[0]) if len(a) > 0 else 256
    V = int(a[1]) if len(a) > 1 else 152064
    T = float(a[2]) if len(a) > 2 else 0.7
    top_p = float(a[3]) if len(a) > 3 else 0.9
    step = int(a[4]) if len(a) > 4 else 1
    bulk = bulk_table()
    sizes, head64 = [], []
    for r in range(rows):
        s = row_values(bulk, r, step, V) / T
        order = np.lexsort((np.arange(V), -s))
        p = np.exp(s[order] - s[order[0]])
        p /= p.sum()
        c = np.cumsum(p)
        sizes.append(int(np.searchsorted(c - p, top_p, side="left")))  # mass before < top_p
        head64.append(float(c[min(64, V) - 1]))
    k = np.array(sizes)
    print(f"{rows} rows x {V}, T {T}, top-p {top_p}, step {step}: nucleus size mean {k.mean():.1f}, "
          f"median {int(np.median(k))}, max {k.max()}")
    for B in (64, 128, 256, 512, 1024, 2048, 4096):
        print(f"  candidates {B:5d}: the nucleus of {100 * (k <= B).mean():5.1f} % of rows")
    big = k > 64
    if big.any():
        print(f"  rows beyond 64: {int(big.sum())}, the first 64's mass there: mean "
              f"{np.array(head64)[big].mean():.3f}; sizes {sorted(k[big].tolist())}")


if __name__ == "__main__":
    main()
