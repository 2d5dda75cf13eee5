#!/usr/bin/env python3
"""ncu_sum.py — sum an `ncu --csv --metrics gpu__time_duration.sum` log per kernel.

Usage: ncu_sum.py LOG [--from REGEX] [--top N]
Prints each kernel (name cut at its first '(' or '<', plus grid and block) with its call count, total and mean
GPU time and share, largest first, and the total. --from skips every launch before the first whose name matches
REGEX (e.g. the random-weight synthesis before a benchmark). Kernel durations only: the gaps between kernels
(host launches, syncs) are not in it; compare the total with the wall time of the same run.
"""
import csv, re, sys

def main():
    a = sys.argv[1:]
    if not a:
        print(__doc__); return 2
    log, start, top = a[0], None, 40
    if "--from" in a: start = re.compile(a[a.index("--from") + 1])
    if "--top" in a: top = int(a[a.index("--top") + 1])
    rows = []
    with open(log, newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum": continue
        try: v = float(r["Metric Value"].replace(",", ""))
        except ValueError: continue
        unit = r.get("Metric Unit", "ns")
        v *= {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}.get(unit, 1e-3)
        rows.append((r["Kernel Name"], r.get("Grid Size", ""), r.get("Block Size", ""), v))
    if start:
        i = next((i for i, x in enumerate(rows) if start.search(x[0])), 0)
        rows = rows[i:]
    agg = {}
    for name, g, b, v in rows:
        k = (re.split(r"[(<]", name, 1)[0].strip(), g, b)
        n, t = agg.get(k, (0, 0.0))
        agg[k] = (n + 1, t + v)
    tot = sum(t for _, t in agg.values())
    print(f"{len(rows)} launches, {tot:.1f} us of kernel time")
    print(f"{'share':>6} {'total us':>10} {'calls':>6} {'mean us':>9}  kernel grid block")
    for k, (n, t) in sorted(agg.items(), key=lambda x: -x[1][1])[:top]:
        print(f"{100 * t / tot:5.1f}% {t:10.1f} {n:6d} {t / n:9.1f}  {k[0][:70]} {k[1]} {k[2]}")
    return 0

if __name__ == "__main__":
    sys.exit(main())
