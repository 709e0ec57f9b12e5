"""Summarizes STAMP lines of the split exact rows (session 30's and 31's
instrumentation): per round the histogram pass, the cluster barrier and the
merge, then the race pass and the end (the winners' barrier, the token).
Units in a line: 10 ns. Usage: stamps31.py FILE... (medians / min / max, us)."""
import re, statistics, sys

rows = []
for f in sys.argv[1:]:
    for line in open(f, errors='replace'):
        m = re.search(r'STAMP row (\d+) chunk (\d+) mode0 (\d+) tie (\d+)(?: scan (\d+))? rounds (\d+) '
                      r'total_us ([\d.]+) : ([\d ]+)', line)
        if m:
            d = [int(x) / 100.0 for x in m.group(8).split()]
            rows.append(dict(row=int(m.group(1)), chunk=int(m.group(2)), tie=int(m.group(4)),
                             scan=m.group(5), rounds=int(m.group(6)), total=float(m.group(7)), d=d))
if not rows:
    sys.exit('no STAMP lines')
by_rounds = {}
for r in rows:
    by_rounds.setdefault(r['rounds'], []).append(r)


def show(name, xs):
    if xs:
        print(f'  {name:<12} {statistics.median(xs):7.2f} / {min(xs):7.2f} / {max(xs):7.2f}  (n={len(xs)})')


for n, rs in sorted(by_rounds.items()):
    print(f'{len(rs)} stamps with {n} rounds (median / min / max, us)')
    for k in range(n):
        show(f'hist {k}', [r['d'][3 * k] for r in rs if len(r['d']) > 3 * k])
        show(f'barrier {k}', [r['d'][3 * k + 1] for r in rs if len(r['d']) > 3 * k + 1])
        show(f'merge {k}', [r['d'][3 * k + 2] for r in rs if len(r['d']) > 3 * k + 2])
    show('race', [r['d'][3 * n] for r in rs if len(r['d']) > 3 * n])
    scanned = [r['d'][3 * n] for r in rs if r['scan'] == '1' and len(r['d']) > 3 * n]
    unscanned = [r['d'][3 * n] for r in rs if r['scan'] == '0' and len(r['d']) > 3 * n]
    show('race, scan', scanned)
    show('race, whole', unscanned)
    show('end', [r['d'][3 * n + 1] for r in rs if len(r['d']) > 3 * n + 1])
    show('row', [r['total'] for r in rs])
