#!/usr/bin/env python3
"""r1t_emulate.py — a lane-level emulation of attn_decode_r1.cu's transposed form (TERN_CUDA_AD_R1_TR) on the CPU.

Why: the fragment mapping of a tensor-core kernel can be wrong in ways that only a GPU run shows, and GPU time is
scarce. This walks one warp group (DS warps, each over D/DS dimensions) of the kernel through its chunks with the
mma.m16n8k16 fragment layouts of mma.cuh (A: a0 (row g, k 2t..), a1 (row g+8), a2 (row g, k 2t+8..), a3; B: b0 (k 2t..,
col g), b1 (k 2t+8..); C: c0 c1 (row g, cols 2t, 2t+1), c2 c3 (row g+8)), the same loads (K rows g, g+8 of a chunk,
dimensions t·DL + 2w; V rows 2t, 2t+1, 2t+8, 2t+9, dimensions g·DV + 2w), the same shuffles and byte permutes, and
compares the outputs with a reference softmax attention. Products are exact (float64); the hi / lo halves are
emulated as 3/4 and 1/4 of each value, so a misplaced lo column shows. Run: python3 scripts/r1t_emulate.py (numpy).
"""
import sys

import numpy as np


def mma(C, A, B):
    """C += A·B over per-lane registers (pairs as (low, high) halves)"""
    Am, Bm, Cm = np.zeros((16, 16)), np.zeros((16, 8)), np.zeros((16, 8))
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        a, b, c = A[lane], B[lane], C[lane]
        Am[g, 2 * t:2 * t + 2], Am[g + 8, 2 * t:2 * t + 2] = a[0], a[1]
        Am[g, 2 * t + 8:2 * t + 10], Am[g + 8, 2 * t + 8:2 * t + 10] = a[2], a[3]
        Bm[2 * t:2 * t + 2, g], Bm[2 * t + 8:2 * t + 10, g] = b[0], b[1]
        Cm[g, 2 * t:2 * t + 2], Cm[g + 8, 2 * t:2 * t + 2] = c[0:2], c[2:4]
    Cm = Cm + Am @ Bm
    return [[Cm[l >> 2, 2 * (l & 3)], Cm[l >> 2, 2 * (l & 3) + 1], Cm[(l >> 2) + 8, 2 * (l & 3)],
             Cm[(l >> 2) + 8, 2 * (l & 3) + 1]] for l in range(32)]


def split(x, y):  # tc_split: (hi pair, lo pair)
    return (0.75 * x, 0.75 * y), (0.25 * x, 0.25 * y)


def perm(x, y, high):  # __byte_perm(x, y, high ? 0x7632 : 0x5410)
    return (x[1], y[1]) if high else (x[0], y[0])


def run(D, G, nch, keys, seed=1):
    rng = np.random.default_rng(seed)
    DS = D // 128 if D > 128 else 1
    DH = D // DS
    NK, NM, DL, DV = DH // 16, DH // 16, DH // 4, DH // 8
    K, V, Q = rng.standard_normal((16 * nch, D)), rng.standard_normal((16 * nch, D)), rng.standard_normal((G, D))
    K[keys:] = 0
    V[keys:] = 0
    scale, lanes = 1 / np.sqrt(D), range(32)
    qb, o, m, lsum = {}, {}, {}, {}
    for hf in range(DS):
        for l in lanes:
            g, t = l >> 2, l & 3
            hq = g >> 1
            for kk in range(NK):
                x = Q[hq, hf * DH + t * DL + 4 * kk:][:4] if hq < G else np.zeros(4)
                (h0, l0), (h1, l1) = split(x[0], x[1]), split(x[2], x[3])
                qb[hf, l, kk] = (l0 if g & 1 else h0, l1 if g & 1 else h1)
            o[hf, l], m[hf, l], lsum[hf, l] = [[0.0] * 4 for _ in range(NM)], -np.inf, 0.0
    for c in range(nch):
        kw, vw, ok, part = {}, {}, {}, {}
        for hf in range(DS):
            for l in lanes:
                g, t = l >> 2, l & 3
                for j in range(2):
                    key = 16 * c + 8 * j + g
                    ok[l, j] = key < keys
                    row = K[key, hf * DH + t * DL:]
                    kw[hf, l, j] = [(row[2 * w], row[2 * w + 1]) for w in range(DL // 2)]
                for v in range(4):
                    row = V[16 * c + 8 * (v >> 1) + 2 * t + (v & 1), hf * DH + g * DV:]
                    vw[hf, l, v] = [(row[2 * w], row[2 * w + 1]) for w in range(DV // 2)]
            sc = [[0.0] * 4 for _ in lanes]
            for kk in range(NK):
                A = [[kw[hf, l, 0][2 * kk], kw[hf, l, 1][2 * kk], kw[hf, l, 0][2 * kk + 1], kw[hf, l, 1][2 * kk + 1]]
                     for l in lanes]
                sc = mma(sc, A, [qb[hf, l, kk] for l in lanes])
            part[hf] = [[sc[l][0] + sc[l][1], sc[l][2] + sc[l][3]] for l in lanes]
        for hf in range(DS):  # every warp of the group sums the parts in part order
            s = [[sum(part[h][l][v] for h in range(DS)) * scale if ok[l, v] else -np.inf for v in range(2)]
                 for l in lanes]
            cm = [max(s[l]) for l in lanes]
            for sh in (4, 8, 16):
                cm = [max(cm[l], cm[l ^ sh]) for l in lanes]
            al, p = [0.0] * 32, [None] * 32
            for l in lanes:
                mn = max(m[hf, l], cm[l])
                al[l] = 0.0 if m[hf, l] == -np.inf else np.exp(m[hf, l] - mn)
                p[l] = [0.0 if s[l][v] == -np.inf else np.exp(s[l][v] - mn) for v in range(2)]
                lsum[hf, l] = lsum[hf, l] * al[l] + p[l][0] + p[l][1]
                m[hf, l] = mn
            b = []
            for l in lanes:
                g, t = l >> 2, l & 3
                src = 8 * t + (g >> 1)
                (h0, l0), (h1, l1) = split(p[src][0], p[src + 4][0]), split(p[src][1], p[src + 4][1])
                b.append((l0 if g & 1 else h0, l1 if g & 1 else h1))
            for mt in range(NM):
                e0, e1, hi = mt >> 1, (NM + mt) >> 1, mt & 1
                A = [[perm(vw[hf, l, 0][e0], vw[hf, l, 1][e0], hi), perm(vw[hf, l, 0][e1], vw[hf, l, 1][e1], hi),
                      perm(vw[hf, l, 2][e0], vw[hf, l, 3][e0], hi), perm(vw[hf, l, 2][e1], vw[hf, l, 3][e1], hi)]
                     for l in lanes]
                r = mma([[x * al[l] for x in o[hf, l][mt]] for l in lanes], A, b)
                for l in lanes:
                    o[hf, l][mt] = r[l]
    out = np.zeros((G, D))
    for hf in range(DS):
        ls = [lsum[hf, l] for l in lanes]
        for sh in (4, 8, 16):
            ls = [ls[l] + ls[l ^ sh] for l in lanes]
        for l in lanes:
            g, t = l >> 2, l & 3
            if t < G:
                for mt in range(NM):
                    out[t, hf * DH + g * DV + mt] = (o[hf, l][mt][0] + o[hf, l][mt][1]) / ls[l]
                    out[t, hf * DH + g * DV + NM + mt] = (o[hf, l][mt][2] + o[hf, l][mt][3]) / ls[l]
    sr = Q @ K[:keys].T * scale
    pr = np.exp(sr - sr.max(1, keepdims=True))
    return np.abs(out - (pr / pr.sum(1, keepdims=True)) @ V[:keys]).max()


if __name__ == "__main__":
    bad = 0
    for D, G, nch, keys in [(64, 4, 2, 29), (128, 1, 1, 16), (128, 3, 3, 43), (128, 4, 4, 64), (256, 2, 3, 40),
                            (512, 4, 2, 17)]:
        err = run(D, G, nch, keys)
        bad += err > 1e-12
        print("D %3d G %d chunks %d keys %2d: max abs err %.1e" % (D, G, nch, keys, err))
    sys.exit(1 if bad else 0)
