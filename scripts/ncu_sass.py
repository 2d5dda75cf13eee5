#!/usr/bin/env python3
"""ncu_sass.py — summarize one kernel's per-instruction SASS counters.

Input: the CSV of `ncu --import REP --page source --csv --print-source sass` (a SourceCounters capture, e.g.
gpu_ab.sh section 73's gu_sass.csv). Output: where the warps' stall samples fall, grouped three ways:
  - by execution count (instructions run once a warp vs. loop bodies: the count tells how often a line ran),
  - by runs of consecutive lines with the same count (prologue, loop bodies, epilogue), the heaviest first,
  - by stall reason over the whole kernel.
Usage: scripts/ncu_sass.py FILE.csv [--top N] [--lines]   (--lines: also every line with >= 1 % of the samples)
"""
import csv
import sys
from collections import Counter, defaultdict


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if not args:
        sys.exit(__doc__)
    top = 15
    if "--top" in sys.argv:
        top = int(sys.argv[sys.argv.index("--top") + 1])
        args = [a for a in args if a != str(top)]
    rows = list(csv.reader(open(args[0], newline="")))
    hi = next(i for i, r in enumerate(rows) if "Address" in r and "Source" in r)
    hdr, data = rows[hi], [r for r in rows[hi + 1:] if len(r) == len(rows[hi])]
    ix = {h: i for i, h in enumerate(hdr)}
    ex, sm = ix["Instructions Executed"], ix["Warp Stall Sampling (All Samples)"]
    stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    num = lambda r, i: int(float(r[i] or 0))
    tot_i = sum(num(r, ex) for r in data) or 1
    tot_s = sum(num(r, sm) for r in data) or 1
    print(f"{len(data)} SASS lines, {tot_i} warp instructions, {tot_s} stall samples")

    by = defaultdict(lambda: [0, 0, 0])
    for r in data:
        b = by[num(r, ex)]
        b[0] += 1
        b[1] += num(r, ex)
        b[2] += num(r, sm)
    print("\nby execution count (count: lines, share of instructions, share of samples)")
    for e, (n, i, s) in sorted(by.items(), key=lambda kv: -kv[1][2])[:top]:
        print(f"  {e:9d}: {n:5d} lines  {100 * i / tot_i:5.1f} %  {100 * s / tot_s:5.1f} %")

    runs, cur = [], None
    for k, r in enumerate(data):
        e = num(r, ex)
        if cur and cur[2] == e:
            cur[1], cur[3] = k, cur[3] + num(r, sm)
        else:
            cur = [k, k, e, num(r, sm)]
            runs.append(cur)
    print("\nruns of lines with one count, heaviest by samples (first-last line, count, share of samples, top stalls)")
    for a, b, e, s in sorted(runs, key=lambda x: -x[3])[:top]:
        c = Counter()
        for r in data[a:b + 1]:
            for h in stalls:
                c[h[6:]] += num(r, ix[h])
        why = ", ".join(f"{k} {v}" for k, v in c.most_common(3) if v)
        print(f"  {a:5d}-{b:5d}  x{e:<7d} {100 * s / tot_s:5.1f} %  {why}")

    c = Counter()
    for r in data:
        for h in stalls:
            c[h[6:]] += num(r, ix[h])
    print("\nstall reasons: " + ", ".join(f"{k} {100 * v / tot_s:.1f} %" for k, v in c.most_common(8) if v))

    if "--lines" in sys.argv:
        print("\nlines with >= 1 % of the samples (line, count, samples, SASS)")
        for k, r in enumerate(data):
            if num(r, sm) * 100 >= tot_s:
                print(f"  {k:5d} x{num(r, ex):<7d} {num(r, sm):5d}  {r[ix['Source']].strip()}")


if __name__ == "__main__":
    main()
