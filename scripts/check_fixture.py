#!/usr/bin/env python3
"""check_fixture.py — compare a logits file with a parity fixture (numpy only; a debugging aid).

usage: check_fixture.py FIXTURE_DIR LOGITS.f32 [--tol 1e-4] [--generated "id id ..."]

LOGITS.f32 is what `tern logits MODEL --ids <all_ids of ref.json> --out LOGITS.f32` writes:
float32 little-endian, row-major [len(all_ids), vocab], final logits after the softcap.
Per row t it prints ||x_t - ref_t||_2 / ||ref_t||_2, both argmaxes and the reference's
top-1/top-2 gap, then a summary. --generated compares a greedy continuation (the ids
`tern generate --print-ids` printed) with all_ids[len(prompt_ids):]. Exit status 0 when
every row is within --tol, every argmax agrees and the continuation (if given) matches.
"""
import argparse
import json
import os
import sys

import numpy as np


def load_fixture(d):
    with open(os.path.join(d, "ref.json")) as f:
        ref = json.load(f)
    logits = np.fromfile(os.path.join(d, "ref_logits.f32"), dtype="<f4")
    return ref, logits.reshape(ref["logits_shape"]).astype(np.float64)


def compare(ref_logits, x):
    """-> (per-row relative L2 errors, reference argmax, candidate argmax)."""
    den = np.maximum(np.linalg.norm(ref_logits, axis=1), 1e-30)
    rel = np.linalg.norm(x - ref_logits, axis=1) / den
    return rel, ref_logits.argmax(axis=1), x.argmax(axis=1)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("fixture")
    ap.add_argument("logits")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--generated", default=None, help="space- or comma-separated ids")
    a = ap.parse_args(argv)
    ref, R = load_fixture(a.fixture)
    raw = np.fromfile(a.logits, dtype="<f4").astype(np.float64)
    if raw.size != R.size:
        print(f"FAIL: {a.logits} holds {raw.size} floats, expected {R.shape[0]}x{R.shape[1]}")
        return 1
    X = raw.reshape(R.shape)
    rel, ra, xa = compare(R, X)
    srt = np.sort(R, axis=1)
    gap = srt[:, -1] - srt[:, -2]
    ids = ref["all_ids"]
    print(f"{ref['case']}: {R.shape[0]} rows x {R.shape[1]} vocab, tol {a.tol:g}")
    print(" row    id   rel_L2      ref_arg  got_arg  ref_gap")
    for t in range(R.shape[0]):
        mark = "" if (rel[t] <= a.tol and ra[t] == xa[t]) else "  <--"
        print(f"{t:4d} {ids[t]:5d}  {rel[t]:.3e}  {ra[t]:7d}  {xa[t]:7d}  {gap[t]:.4f}{mark}")
    ok = bool(np.all(rel <= a.tol) and np.all(ra == xa) and np.all(np.isfinite(X)))
    print(f"max rel_L2 {rel.max():.3e} (row {int(rel.argmax())}), argmax agree "
          f"{int((ra == xa).sum())}/{len(ra)}")
    if a.generated is not None:
        got = [int(t) for t in a.generated.replace(",", " ").split()]
        want = ids[len(ref["prompt_ids"]):]
        same = got[:len(want)] == want[:len(got)] and len(got) >= len(want)
        print(f"greedy continuation: want {want} got {got} -> {'same' if same else 'DIFFERENT'}")
        ok = ok and same
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
