#!/usr/bin/env python3
"""ncu_step.py — one decode step's (or a prefill's) kernels from an ncu CSV, grouped and ranked.

Input: the CSV of `ncu [--graph-profiling node] --metrics gpu__time_duration.sum --csv --print-units base
tern-core bench ...` (plain or .xz).
  python3 scripts/ncu_step.py ncu_q4.csv.xz                   # the last decode step (run --gen 3 or more):
      a decode step ends with the sampling kernel; the step between the last two is summed
  python3 scripts/ncu_step.py ncu_26b.csv --from embed_kernel # every kernel from the first whose name matches
      (a prefill: `--prompt 2048 --gen 1 --warmup 0`, from its first embedding lookup)
  python3 scripts/ncu_step.py ncu_26b.csv --seq 30            # also the last step's first 30 kernels in launch
      order (a layer's sequence: kernels of one name and grid told apart)
Per kernel name and grid: total, share, calls, mean. ncu serialises kernels (and, unless told otherwise, locks
clocks and flushes caches): with `--cache-control none --clock-control none` a 2048-row Gemma 4 prefill summed
within 5 % of its wall time (NOTES (ai)); a decode step reads ~1.4x the real step: use the shares.
"""
import collections
import csv
import lzma
import re
import sys


def main(path, start=None, seq=0):
    opener = lzma.open if path.endswith(".xz") else open
    with opener(path, "rt") as f:
        rows = list(csv.reader(f))
    head = next(i for i, r in enumerate(rows) if r and r[0] == "ID")
    ks = [(r[4], r[8], float(r[14].replace(",", "")) / 1000) for r in rows[head + 1:] if len(r) > 14]
    if start:
        rx = re.compile(start)
        first = next((i for i, k in enumerate(ks) if rx.search(k[0])), None)
        if first is None:
            sys.exit(f"no kernel matches {start}")
        step = ks[first:]
    else:
        ends = [i for i, k in enumerate(ks) if "sample" in k[0]]
        if len(ends) < 2:
            sys.exit("fewer than two sampling kernels: run more than one decode step")
        step = ks[ends[-2] + 1:ends[-1] + 1]
    tot = sum(t for _, _, t in step)
    agg = collections.OrderedDict()
    for name, grid, t in step:
        key = re.sub(r"\(.*", "", name)[:90] + " " + grid
        c = agg.setdefault(key, [0, 0.0])
        c[0] += 1
        c[1] += t
    print(f"{len(step)} kernels, {tot:.1f} us (ncu time)")
    for key, (n, t) in sorted(agg.items(), key=lambda x: -x[1][1]):
        print(f"{t:9.1f} us {100 * t / tot:5.1f}%  n={n:3d}  avg {t / n:7.2f}  {key}")
    if seq:  # the step's first kernels in launch order (one layer's sequence)
        print(f"first {seq} kernels in order:")
        for name, grid, t in step[:seq]:
            print(f"{t:9.2f} us  {re.sub(r'[(].*', '', name)[:90]} {grid}")


if __name__ == "__main__":
    a = sys.argv[1:]
    try:
        if len(a) == 1:
            main(a[0])
        elif len(a) == 3 and a[1] == "--from":
            main(a[0], a[2])
        elif len(a) == 3 and a[1] == "--seq":
            main(a[0], None, int(a[2]))
        else:
            sys.exit(__doc__)
    except BrokenPipeError:  # `| head`: the reader has what it wanted
        sys.stderr.close()
