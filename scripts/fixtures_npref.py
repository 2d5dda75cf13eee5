#!/usr/bin/env python3
"""fixtures_npref.py — an independent numpy (float64) forward pass for the parity fixtures.

usage: fixtures_npref.py [--f32] [FIXTURE_DIR ...]   (default: every case under tests/parity/fixtures)

Written from the specs (shared reference gemma4.md, the Llama/Qwen papers), not from the
transformers code, and reading only what a loader sees: config.json (Hub-flat,
per_layer_config or Hub rope_scaling forms; nested text_config) and the safetensors
(HF names or MLX names + affine-quantized tensors with per-module overrides). It runs one
forward over ref.json's all_ids and prints the per-row relative L2 error against
ref_logits.f32. Agreement to ~1e-6 shows the fixtures mean what the spec says, so a C port
that follows the spec can match them. --f32 runs the same code in float32 (weights,
activations, accumulation) to show what a plain f32 implementation reaches. numpy only;
nothing here is part of the test suite.
"""
import json
import math
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fixtures_mlx as fm  # noqa: E402
from check_fixture import compare, load_fixture  # noqa: E402

DT = np.float64  # compute dtype; --f32 switches to float32


class Weights:
    """Name -> float64 array; MLX-quantized modules are dequantized on access."""

    def __init__(self, d, cfg):
        self.t, _ = fm.read_safetensors(os.path.join(d, "model.safetensors"))
        self.q = cfg.get("quantization") or {}
        names = list(self.t)
        for p in ("model.language_model.", "language_model.model.", "model."):
            if any(n.startswith(p + "embed_tokens.") for n in names):
                self.prefix = p
                break

    def has(self, name):
        n = self.prefix + name
        return n in self.t or n + ".weight" in self.t

    def get(self, name):
        n = self.prefix + name
        if n.endswith(".weight") and n[:-7] + ".scales" in self.t:
            path = n[:-7]
            o = self.q.get(path) or {}
            bits, gs = o.get("bits", self.q["bits"]), o.get("group_size", self.q["group_size"])
            return fm.mlx_dequantize(self.t[n][1], self.t[path + ".scales"][1],
                                     self.t[path + ".biases"][1], bits, gs).astype(DT)
        return fm.to_f64(*self.t[n]).astype(DT)


def rms(x, w=None, eps=1e-6, plus_one=False):
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y if w is None else y * ((1.0 + w) if plus_one else w)


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def silu(x):
    return x / (1.0 + np.exp(-x))


def rope(x, inv, pos):
    """x [T, heads, D]; half-split (rotate_half) pairs i, i+D/2; angles computed in float32."""
    ang = (pos.astype(np.float32)[:, None] * inv.astype(np.float32)[None, :]).astype(np.float32)
    c = np.cos(ang).astype(DT)[:, None, :]
    s = np.sin(ang).astype(DT)[:, None, :]
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def inv_default(base, d):
    return (1.0 / np.float32(base) ** (np.arange(0, d, 2, dtype=np.float32) / np.float32(d))).astype(np.float32)


def attention(q, k, v, scale, window=None):
    """q [T, nH, D], k/v [T, nKV, D]; causal (+ sliding: a - b < window)."""
    T, nH, _ = q.shape
    r = nH // k.shape[1]
    a = np.arange(T)[:, None]
    b = np.arange(T)[None, :]
    allowed = b <= a
    if window:
        allowed &= (a - b) < window
    out = np.empty((T, nH, v.shape[-1]), dtype=q.dtype)
    for h in range(nH):
        s = (q[:, h, :] @ k[:, h // r, :].T) * scale
        s = np.where(allowed, s, -np.inf)
        s = np.exp(s - s.max(axis=1, keepdims=True))
        out[:, h, :] = (s / s.sum(axis=1, keepdims=True)) @ v[:, h // r, :]
    return out.reshape(T, -1)


# ------------------------------------------------------------------ Gemma 4 --

def gemma4_forward(cfg, W, ids):
    c = cfg.get("text_config", cfg)
    H, N, nH = c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"]
    eps, types = c["rms_norm_eps"], c["layer_types"]
    P = c.get("hidden_size_per_layer_input") or 0
    S = c.get("num_kv_shared_layers") or 0
    plc = c.get("per_layer_config") or {}
    geo = []
    for l in range(N):
        full = types[l] == "full_attention"
        keqv = bool(c.get("attention_k_eq_v")) and full
        D = (c.get("global_head_dim") or c["head_dim"]) if full else c["head_dim"]
        nkv = (c.get("num_global_key_value_heads") or c["num_key_value_heads"]) if keqv \
            else c["num_key_value_heads"]
        o = plc.get(str(l), {})
        geo.append((full, keqv, o.get("head_dim", D), o.get("num_key_value_heads", nkv)))
    first_shared = N - S
    ids = np.asarray(ids)
    T = len(ids)
    pos = np.arange(T)
    E = W.get("embed_tokens.weight")
    h = E[ids] * math.sqrt(H)
    if P:
        a = (W.get("embed_tokens_per_layer.weight")[ids] * math.sqrt(P)).reshape(T, N, P)
        b = (h @ W.get("per_layer_model_projection.weight").T * H ** -0.5).reshape(T, N, P)
        ple = (rms(b, W.get("per_layer_projection_norm.weight"), eps) + a) * 2 ** -0.5
    rp = c["rope_parameters"]
    cache = {}
    for l in range(N):
        full, keqv, D, nkv = geo[l]
        L = f"layers.{l}."
        rpl = rp["full_attention" if full else "sliding_attention"]
        inv = inv_default(rpl["rope_theta"], D)
        if rpl.get("rope_type") == "proportional":
            R = int(rpl.get("partial_rotary_factor", 1.0) * D // 2)
            inv[R:] = 0.0
            inv = inv / np.float32(rpl.get("factor", 1.0))
        x = rms(h, W.get(L + "input_layernorm.weight"), eps)
        q = (x @ W.get(L + "self_attn.q_proj.weight").T).reshape(T, nH, D)
        q = rope(rms(q, W.get(L + "self_attn.q_norm.weight"), eps), inv, pos)
        if S and l >= first_shared:
            src = max(j for j in range(first_shared) if geo[j][0] == full)
            k, v = cache[src]
        else:
            kr = (x @ W.get(L + "self_attn.k_proj.weight").T).reshape(T, nkv, D)
            vr = kr if keqv else (x @ W.get(L + "self_attn.v_proj.weight").T).reshape(T, nkv, D)
            k = rope(rms(kr, W.get(L + "self_attn.k_norm.weight"), eps), inv, pos)
            v = rms(vr, None, eps)
            cache[l] = (k, v)
        o = attention(q, k, v, 1.0, None if full else c["sliding_window"])
        h = h + rms(o @ W.get(L + "self_attn.o_proj.weight").T, W.get(L + "post_attention_layernorm.weight"), eps)
        r = h
        x1 = rms(r, W.get(L + "pre_feedforward_layernorm.weight"), eps)
        m = (gelu_tanh(x1 @ W.get(L + "mlp.gate_proj.weight").T) * (x1 @ W.get(L + "mlp.up_proj.weight").T)) \
            @ W.get(L + "mlp.down_proj.weight").T
        if c.get("enable_moe_block"):
            m = rms(m, W.get(L + "post_feedforward_layernorm_1.weight"), eps)
            z = rms(r, None, eps) * W.get(L + "router.scale") * H ** -0.5
            lg = z @ W.get(L + "router.proj.weight").T
            if W.has(L + "experts.gate_up_proj"):
                gu = W.get(L + "experts.gate_up_proj")
                Ie = gu.shape[1] // 2
                Wg, Wu, Wd = gu[:, :Ie], gu[:, Ie:], W.get(L + "experts.down_proj")
            else:
                sg = L + "experts.switch_glu."
                Wg, Wu, Wd = (W.get(sg + p + ".weight") for p in ("gate_proj", "up_proj", "down_proj"))
            pes = W.get(L + "router.per_expert_scale")
            x2 = rms(r, W.get(L + "pre_feedforward_layernorm_2.weight"), eps)
            m2 = np.zeros_like(r)
            K = c["top_k_experts"]
            for t in range(T):
                idx = np.argsort(-lg[t], kind="stable")[:K]
                p = np.exp(lg[t, idx] - lg[t, idx].max())
                w = p / p.sum() * pes[idx]
                for e, we in zip(idx, w):
                    m2[t] += we * (Wd[e] @ (gelu_tanh(Wg[e] @ x2[t]) * (Wu[e] @ x2[t])))
            m = m + rms(m2, W.get(L + "post_feedforward_layernorm_2.weight"), eps)
        h = r + rms(m, W.get(L + "post_feedforward_layernorm.weight"), eps)
        if P:
            g = gelu_tanh(h @ W.get(L + "per_layer_input_gate.weight").T) * ple[:, l, :]
            h = h + rms(g @ W.get(L + "per_layer_projection.weight").T,
                        W.get(L + "post_per_layer_input_norm.weight"), eps)
        h = h * W.get(L + "layer_scalar")[0]
    logits = rms(h, W.get("norm.weight"), eps) @ E.T
    cap = c.get("final_logit_softcapping")
    return cap * np.tanh(logits / cap) if cap else logits


# ------------------------------------------------------------ Llama / Qwen --

def llama_inv_freq(cfg, D):
    rp = dict(cfg.get("rope_parameters") or {})
    if cfg.get("rope_scaling"):
        rp.update(cfg["rope_scaling"])
    theta = rp.get("rope_theta", cfg.get("rope_theta", 10000.0))
    inv = inv_default(theta, D).astype(np.float64)
    if rp.get("rope_type", rp.get("type")) == "llama3":
        f, lo, hi = rp["factor"], rp["low_freq_factor"], rp["high_freq_factor"]
        old = rp["original_max_position_embeddings"]
        wl = 2 * math.pi / inv
        out = np.where(wl > old / lo, inv / f, inv)
        smooth = (old / wl - lo) / (hi - lo)
        mid = (wl >= old / hi) & (wl <= old / lo)
        out = np.where(mid, (1 - smooth) * out / f + smooth * out, out)
        inv = out
    return inv


def llama_forward(cfg, W, ids):
    H, N, nH, nkv = (cfg[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                      "num_key_value_heads"))
    D = cfg.get("head_dim") or H // nH
    eps = cfg["rms_norm_eps"]
    qwen3 = cfg["model_type"] == "qwen3"
    ids = np.asarray(ids)
    T = len(ids)
    pos = np.arange(T)
    inv = llama_inv_freq(cfg, D)
    E = W.get("embed_tokens.weight")
    h = E[ids]

    def lin(x, name):
        y = x @ W.get(name + ".weight").T
        return y + W.get(name + ".bias") if W.has(name + ".bias") and (W.prefix + name + ".bias") in W.t else y

    for l in range(N):
        L = f"layers.{l}."
        x = rms(h, W.get(L + "input_layernorm.weight"), eps)
        q = lin(x, L + "self_attn.q_proj").reshape(T, nH, D)
        k = lin(x, L + "self_attn.k_proj").reshape(T, nkv, D)
        v = lin(x, L + "self_attn.v_proj").reshape(T, nkv, D)
        if qwen3:
            q = rms(q, W.get(L + "self_attn.q_norm.weight"), eps)
            k = rms(k, W.get(L + "self_attn.k_norm.weight"), eps)
        q, k = rope(q, inv, pos), rope(k, inv, pos)
        o = attention(q, k, v, D ** -0.5)
        h = h + lin(o, L + "self_attn.o_proj")
        x = rms(h, W.get(L + "post_attention_layernorm.weight"), eps)
        h = h + lin(silu(lin(x, L + "mlp.gate_proj")) * lin(x, L + "mlp.up_proj"), L + "mlp.down_proj")
    hN = rms(h, W.get("norm.weight"), eps)
    head = fm.to_f64(*W.t["lm_head.weight"]).astype(DT) if "lm_head.weight" in W.t else E
    return hN @ head.T


def run(d):
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    ref, R = load_fixture(d)
    W = Weights(d, cfg)
    mt = cfg.get("text_config", cfg)["model_type"]
    fwd = gemma4_forward if re.match(r"gemma4", mt) else llama_forward
    X = fwd(cfg.get("text_config", cfg) if fwd is llama_forward else cfg, W, ref["all_ids"])
    rel, ra, xa = compare(R, X)
    return rel.max(), int((ra == xa).sum()), len(ra)


def main(argv):
    global DT
    if argv and argv[0] == "--f32":
        DT, argv = np.float32, argv[1:]
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "parity", "fixtures")
    dirs = argv or sorted(os.path.join(root, x) for x in os.listdir(root)
                          if os.path.isfile(os.path.join(root, x, "ref.json")))
    bad = 0
    for d in dirs:
        try:
            worst, agree, n = run(d)
            ok = worst <= (1e-4 if DT == np.float32 else 1e-5) and agree == n
            print(f"{'PASS' if ok else 'FAIL'}: {os.path.basename(d.rstrip('/'))}: max rel_L2 {worst:.2e}, argmax {agree}/{n}")
        except Exception as e:  # report and go on with the other cases
            ok = False
            print(f"FAIL: {os.path.basename(d.rstrip('/'))}: {type(e).__name__}: {e}")
        bad += not ok
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
