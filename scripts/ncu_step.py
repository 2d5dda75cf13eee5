#!/usr/bin/env python3
"""ncu_step.py — one decode step's (or a prefill's) kernels from an ncu CSV, grouped and ranked.

Input: the CSV of `ncu [--graph-profiling node] --metrics gpu__time_duration.sum --csv --print-units base
tern-core bench ...` (plain or .xz).
  python3 scripts/ncu_step.py ncu_q4.csv.xz                   # the last decode step (run --gen 3 or more):
      a decode step ends with the sampling kernel; the last step of the widest sampling grid (the whole batch) is
      summed
  python3 scripts/ncu_step.py ncu_26b.csv --from embed_kernel # every kernel from the first whose name matches
      (a prefill: `--prompt 2048 --gen 1 --warmup 0`, from its first embedding lookup)
  python3 scripts/ncu_step.py ncu_26b.csv --seq 30            # also the last step's first 30 kernels in launch
      order (a layer's sequence: kernels of one name and grid told apart)
Per kernel name and grid: total, share, calls, mean. ncu serialises kernels (and, unless told otherwise, locks
clocks and flushes caches): with `--cache-control none --clock-control none` a 2048-row Gemma 4 prefill summed
within 5 % of its wall time (NOTES (ai)); a decode step reads ~1.4x the real step: use the shares.

Also an nsys kernel trace (the CSV of `nsys stats -r cuda_gpu_trace -f csv` over a report recorded with
`nsys profile -t cuda --cuda-graph-trace=node`): the kernels as they ran in the graph, overlapped by PDL. Then each row
adds the time the kernel extended the step past every kernel before it ("exposed": what removing it could save at
most) and the step's wall time; idle gaps are counted apart.
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
    nsys = next((i for i, r in enumerate(rows) if "Start (ns)" in r and "Duration (ns)" in r), None)
    if nsys is not None:  # (name, grid, µs, start ns)
        h = {c: j for j, c in enumerate(rows[nsys])}
        g = [h.get(c) for c in ("GrdX", "GrdY", "GrdZ")]
        ks = [(r[h["Name"]], "(%s)" % ", ".join(r[j] for j in g) if None not in g else "",
               float(r[h["Duration (ns)"]]) / 1000, float(r[h["Start (ns)"]]))
              for r in rows[nsys + 1:] if len(r) == len(h) and (None in g or r[g[0]])]  # kernels, not copies
        ks.sort(key=lambda k: k[3])
    else:
        head = next(i for i, r in enumerate(rows) if r and r[0] == "ID")
        ks = [(r[4], r[8], float(r[14].replace(",", "")) / 1000, None) for r in rows[head + 1:] if len(r) > 14]
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
        # the last step of the full batch: a run's last steps can hold fewer rows (requests that started late
        # finish late), so take the last step whose sampling kernel has the widest grid (one block a row)
        width = [int(re.match(r"\(?(\d*)", ks[e][1]).group(1) or 0) for e in ends]
        w = max(width[1:])
        j = max(i for i in range(1, len(ends)) if width[i] == w)
        step = ks[ends[j - 1] + 1:ends[j] + 1]
    tot = sum(k[2] for k in step)
    agg = collections.OrderedDict()
    front, idle, expo = None, 0.0, []  # nsys: the step's end so far, idle time, each kernel's exposed µs
    for name, grid, t, t0 in step:
        x = 0.0
        if t0 is not None:
            t1 = t0 + t * 1000
            if front is not None and t0 > front:
                idle += (t0 - front) / 1000
            x = max(0.0, t1 - max(t0, front if front is not None else t0)) / 1000
            front = t1 if front is None else max(front, t1)
        expo.append(x)
        key = re.sub(r"\(.*", "", name)[:90] + " " + grid
        c = agg.setdefault(key, [0, 0.0, 0.0])
        c[0] += 1
        c[1] += t
        c[2] += x
    if nsys is not None:
        wall = (front - step[0][3]) / 1000
        print(f"{len(step)} kernels, {tot:.1f} us of kernel time in a step of {wall:.1f} us (idle {idle:.1f})")
        for key, (n, t, x) in sorted(agg.items(), key=lambda a: -a[1][2]):
            print(f"{x:9.1f} us exposed {100 * x / wall:5.1f}%  {t:9.1f} us run  n={n:3d}  avg {t / n:7.2f}  {key}")
    else:
        print(f"{len(step)} kernels, {tot:.1f} us (ncu time)")
        for key, (n, t, _) in sorted(agg.items(), key=lambda a: -a[1][1]):
            print(f"{t:9.1f} us {100 * t / tot:5.1f}%  n={n:3d}  avg {t / n:7.2f}  {key}")
    if seq:  # the step's first kernels in launch order (one layer's sequence)
        print(f"first {seq} kernels in order:")
        for (name, grid, t, _), x in list(zip(step, expo))[:seq]:
            print(f"{t:9.2f} us  {'' if nsys is None else f'exposed {x:7.2f}  '}{re.sub(r'[(].*', '', name)[:90]} {grid}")


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
