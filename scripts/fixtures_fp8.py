#!/usr/bin/env python3
"""fixtures_fp8.py — FP8 (e4m3, block-scaled) copies of parity fixtures, numpy only.

usage: fixtures_fp8.py     (writes tests/parity/fixtures/{glm5_dsa_fp8,llama3_fp8})

The DeepSeek-V3 / GLM-5-FP8 checkpoint convention, as transformers' finegrained_fp8
integration writes and reads it:
  * config.json `quantization_config`: {"quant_method": "fp8", "fmt": "e4m3",
    "activation_scheme": "dynamic", "weight_block_size": [R, C], "modules_to_not_convert": [...]}
  * every converted Linear `<m>.weight` is F8_E4M3 [out, in] plus `<m>.weight_scale_inv` F32
    [ceil(out/R), ceil(in/C)], and W = e4m3 · scale_inv (the "inverse" scale multiplies).
  * quantizer (per R x C block, in float32): scale = 448 / amax(|w|) (1 for an all-zero
    block), q = e4m3(clamp(w · scale, ±448)) rounded to nearest even, scale_inv = 1 / scale.
    Partial edge blocks (out or in not a multiple of R / C) take the amax of what they hold,
    as DeepSeek-V3's own checkpoints do (e.g. kv_a_proj_with_mqa [576, 7168] -> [5, 56]).
Not converted (stay as stored): embeddings, lm_head, norms, the MoE router `mlp.gate` and its
correction bias (not nn.Linear in transformers), and `indexer.weights_proj` (transformers keeps
it in fp32) — listed in modules_to_not_convert where they are Linear.

Reference: the model with every FP8 weight replaced by its dequantization (float64 of
e4m3 · scale_inv), run through the project's independent float64 numpy forward passes
(scripts/fixtures_glm.py np_forward for GLM-5, validated against transformers 5.17 at ~5e-7;
scripts/fixtures_npref.py llama_forward for Llama, ~5e-7). Before quantizing, the script reruns
that forward on the source fixture's bf16 weights and checks it against the source
ref_logits.f32 (recorded as `source_numpy_vs_transformers_rel`). The greedy continuation is
regenerated from the dequantized model (the quantization moves the logits); the prompt is
re-drawn (seeded) until the reference is tie-free: top-1/top-2 gap >= 0.003 on every row and,
for GLM, DSA / router / group gaps >= 1e-4 / 2e-4 / 2e-4.
"""
import ast
import json
import os
import shutil
import sys
import types

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import fixtures_glm as fg  # noqa: E402
import fixtures_mlx as fm  # noqa: E402
import fixtures_npref as npref  # noqa: E402

ROOT = os.path.join(HERE, "..", "tests", "parity", "fixtures")
FP8_MAX = 448.0
fm._NP_OF.setdefault("F8_E4M3", np.uint8)  # raw e4m3 bytes

# ---------------------------------------------------------------- e4m3 -------

def e4m3_table():
    """f64 value of every code 0..255 (0x7f / 0xff NaN)."""
    v = np.zeros(256)
    for c in range(256):
        s, e, m = c >> 7, (c >> 3) & 15, c & 7
        x = np.nan if (e == 15 and m == 7) else ((1 + m / 8) * 2.0 ** (e - 7) if e else m / 8 * 2.0 ** -6)
        v[c] = -x if s else x
    return v


E4M3 = e4m3_table()
POS = E4M3[:127]  # codes 0x00..0x7e, ascending


def to_e4m3(x):
    """float32 array (|x| <= 448) -> uint8 codes, round to nearest, ties to the even code."""
    a = np.abs(x.astype(np.float64)).ravel()
    hi = np.clip(np.searchsorted(POS, a), 0, 126)
    lo = np.clip(hi - 1, 0, 126)
    dlo, dhi = a - POS[lo], POS[hi] - a
    pick = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    code = pick.astype(np.uint8) | np.where(x.ravel() < 0, 0x80, 0).astype(np.uint8)
    return code.reshape(x.shape)


def quantize_block(w, R, C):
    """w [out, in] -> (codes uint8 [out, in], scale_inv f32 [ceil(out/R), ceil(in/C)])."""
    w = np.asarray(w, dtype=np.float32)
    out, inn = w.shape
    so, si = -(-out // R), -(-inn // C)
    q = np.zeros((out, inn), dtype=np.uint8)
    inv = np.zeros((so, si), dtype=np.float32)
    for bo in range(so):
        for bi in range(si):
            blk = w[bo * R:(bo + 1) * R, bi * C:(bi + 1) * C]
            amax = np.float32(np.abs(blk).max())
            scale = np.float32(FP8_MAX) / amax if amax > 0 else np.float32(1.0)
            scaled = np.clip(blk * scale, -FP8_MAX, FP8_MAX).astype(np.float32)
            q[bo * R:(bo + 1) * R, bi * C:(bi + 1) * C] = to_e4m3(scaled)
            inv[bo, bi] = np.float32(1.0) / scale
    return q, inv


def dequant(q, inv, R, C):
    sc = np.repeat(np.repeat(inv.astype(np.float64), R, 0), C, 1)[:q.shape[0], :q.shape[1]]
    return E4M3[q] * sc


# ---------------------------------------------------------------- cases ------

def convert(tensors, R, C, skip):
    """HF tensors -> FP8 tensors; returns (new tensors, dequantized f64 weights by name, names)."""
    out, deq, conv = {}, {}, []
    for n, (dt, a) in tensors.items():
        mod = n[:-len(".weight")] if n.endswith(".weight") else None
        if mod and a.ndim == 2 and not any(mod.endswith(s) for s in skip) and not mod.endswith("embed_tokens"):
            q, inv = quantize_block(fm.to_f64(dt, a), R, C)
            out[n] = ("F8_E4M3", q)
            out[mod + ".weight_scale_inv"] = ("F32", inv)
            deq[n] = dequant(q, inv, R, C)
            conv.append(mod)
        else:
            out[n] = (dt, a)
            deq[n] = fm.to_f64(dt, a)
    return out, deq, conv


def top2_gap(lg):
    s = np.sort(lg, -1)
    return float((s[:, -1] - s[:, -2]).min())


def glm_cfg_ns(cfg):
    return types.SimpleNamespace(**cfg)


def glm_runner(src, cfg, ref):
    orr = ref["oracle_rope"]
    orr = ast.literal_eval(orr) if isinstance(orr, str) else orr
    inv = np.asarray(orr["inv_freq"], dtype=np.float64)
    att, scaling = float(orr["attention_scaling"]), float(orr["attn_softmax_scale"])
    c = glm_cfg_ns(cfg)

    def fwd(W, ids):
        pos = np.arange(len(ids), dtype=np.float64)
        ang = pos[:, None] * inv[None, :].astype(np.float32).astype(np.float64)
        lg, info = fg.np_forward(W, c, ids, np.cos(ang) * att, np.sin(ang) * att, scaling, "inter", "inter")
        return lg, info
    return fwd


class DictWeights(npref.Weights):
    """npref.Weights over an in-memory dict of f64 arrays (full stored names)."""

    def __init__(self, W, raw):
        self.W, self.t, self.q, self.prefix = W, raw, {}, "model."

    def get(self, name):
        return self.W[self.prefix + name]


def llama_runner(src, cfg, ref):
    def fwd(W, ids):
        raw = {k: ("F64", v) for k, v in W.items()}
        return npref.llama_forward(cfg, DictWeights(W, raw), ids), {}
    return fwd


def greedy(fwd, W, prompt, n):
    ids = list(prompt)
    for _ in range(n):
        lg, _ = fwd(W, ids)
        ids.append(int(np.argmax(lg[-1])))
    return ids


def gaps_ok(info):
    d, r, g = info.get("dsa_gaps") or [], info.get("router_gaps") or [], info.get("group_gaps") or []
    return (min(d, default=1) >= fg.DSA_GAP and min(r, default=1) >= fg.ROUTER_GAP
            and min(g, default=1) >= fg.ROUTER_GAP), min(d, default=None), min(r, default=None), min(g, default=None)


def make_case(src_name, dst_name, R, C, skip, runner, seed):
    src = os.path.join(ROOT, src_name)
    dst = os.path.join(ROOT, dst_name)
    cfg = json.load(open(os.path.join(src, "config.json")))
    ref = json.load(open(os.path.join(src, "ref.json")))
    tensors, meta = fm.read_safetensors(os.path.join(src, "model.safetensors"))
    fwd = runner(src, cfg, ref)
    # 1. the numpy forward reproduces the source fixture's transformers logits
    W0 = {n: fm.to_f64(dt, a) for n, (dt, a) in tensors.items()}
    R0 = np.fromfile(os.path.join(src, "ref_logits.f32"), dtype="<f4").reshape(ref["logits_shape"]).astype(np.float64)
    lg0, _ = fwd(W0, ref["all_ids"])
    src_rel = float((np.linalg.norm(lg0 - R0, axis=1) / np.linalg.norm(R0, axis=1)).max())
    assert src_rel < 1e-5, f"{src_name}: numpy forward vs transformers rel {src_rel:.2e}"
    # 2. quantize, dequantize
    ft, Wq, conv = convert(tensors, R, C, skip)
    qeff_lg, _ = fwd(Wq, ref["all_ids"])
    qeff = float((np.linalg.norm(qeff_lg - lg0, axis=1) / np.linalg.norm(lg0, axis=1)).max())
    # 3. a tie-free prompt and its greedy continuation under the dequantized model
    rng = np.random.default_rng(seed)
    V, P = cfg["vocab_size"], len(ref["prompt_ids"])
    prompt = list(ref["prompt_ids"])
    for attempt in range(40):
        ids = greedy(fwd, Wq, prompt, 8)
        lg, info = fwd(Wq, ids)
        ok, dg, rg, gg = gaps_ok(info)
        gap = top2_gap(lg)
        if ok and gap >= 0.003 and len(set(ids[P:])) >= 3:
            break
        prompt = [prompt[0]] + rng.integers(3, V, P - 1).tolist()
    else:
        raise SystemExit(f"{dst_name}: no tie-free prompt in 40 attempts")
    os.makedirs(dst, exist_ok=True)
    for f in os.listdir(dst):
        os.remove(os.path.join(dst, f))
    qc = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [R, C],
          "modules_to_not_convert": sorted(set(["lm_head"] + [s for s in skip if s != "mlp.gate"]))}
    cfg2 = dict(cfg)
    cfg2["quantization_config"] = qc
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg2, f, indent=2)
    if os.path.exists(os.path.join(src, "generation_config.json")):
        shutil.copy(os.path.join(src, "generation_config.json"), dst)
    fm.write_safetensors(os.path.join(dst, "model.safetensors"), ft)
    lg.astype("<f4").tofile(os.path.join(dst, "ref_logits.f32"))
    out = {"case": dst_name, "prompt_ids": prompt, "all_ids": ids, "logits_shape": list(lg.shape),
           "source_case": src_name, "seed": seed, "attempt": attempt,
           "storage_dtype": "F8_E4M3 + F32 weight_scale_inv (converted Linears); others as the source (bf16, F32 bias)",
           "quantization_config": qc, "fp8_modules": len(conv),
           "notes": ("FP8 copy (DeepSeek-V3 / GLM-5-FP8 layout) of %s made by scripts/fixtures_fp8.py with numpy: "
                     "block %dx%d e4m3 quantizer as transformers' Fp8Quantize (scale = 448/amax in f32, RNE cast, "
                     "scale_inv = 1/scale), partial edge blocks as in DeepSeek-V3 checkpoints. Reference = the "
                     "dequantized model (e4m3 * scale_inv in float64) through the project's independent float64 "
                     "numpy forward (%s), which reproduces the source fixture's transformers 5.17 logits at "
                     "%.1e (source_numpy_vs_transformers_rel); transformers itself was not run for this case. "
                     "Greedy continuation regenerated from the dequantized model.")
                    % (src_name, R, C, "scripts/fixtures_glm.py np_forward" if runner is glm_runner
                       else "scripts/fixtures_npref.py llama_forward", src_rel),
           "dtype_ref": "float64 (numpy)", "source_numpy_vs_transformers_rel": src_rel,
           "quantization_effect_rel_diff": qeff, "min_top2_gap": gap,
           "min_dsa_gap": dg, "min_router_choice_gap": rg, "min_group_gap": gg,
           "distinct_generated": len(set(ids[P:])), "n_generated": 8}
    with open(os.path.join(dst, "ref.json"), "w") as f:
        json.dump(out, f, indent=1)
    print(f"{dst_name}: {len(conv)} FP8 modules, source numpy vs HF {src_rel:.1e}, quantization effect "
          f"{qeff:.3f}, top2 gap {gap:.4f}, dsa {dg}, router {rg}, attempt {attempt}")


def main(argv):
    make_case("glm5_dsa", "glm5_dsa_fp8", 128, 128, ["lm_head", "indexer.weights_proj", "mlp.gate"], glm_runner, 2505)
    make_case("llama3", "llama3_fp8", 32, 32, ["lm_head"], llama_runner, 2606)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
