"""fixtures_glm.py — GLM-5 (glm_moe_dsa) parts of the parity fixture generator.

Used by scripts/make_fixtures.py on the GPU machine (numpy + torch there). Contents:
* explore(): what the installed transformers says about GlmMoeDsaConfig (signature,
  defaults, to_dict) and the source of the pieces whose conventions changed across 5.x
  (indexer RoPE pairing, yarn, the attention softmax scale).
* randomize_extra(): the router correction bias (a buffer the generic randomizer skips),
  rounded to bf16 so every storage dtype holds it exactly; fix_bias_dtype() stores it as
  F32 like the released checkpoints.
* config_hub(): rewrite a saved config.json into the Hub form GLM-5.x repos use (derived
  indexer_types / mlp_layer_types, legacy rope_theta + rope_scaling, extra keys transformers
  ignores, a head_dim that is not the rope dim).
* check(): an independent float64 numpy forward written from the spec (glm5.md §3) that
  reads the HF state dict, for each RoPE pairing variant, and measures the gaps that decide
  DSA top-k and MoE routing (the fixture is rejected when a gap is too small).
* quantize_copy(): the MLX copy (switch_mlp stacks, kv_b_proj split into embed_q /
  unembed_out, per-module overrides) and the dequantized weights put back into the model.
"""
import inspect
import json
import re

import numpy as np

import fixtures_mlx as fm

DSA_GAP = 1e-4      # min gap between the K-th and (K+1)-th index score (f32 error ~1e-6)
ROUTER_GAP = 2e-4   # min gap of the expert / group choice scores (sigmoid + bias, ~1e-7)


def explore(T, log):
    info = {}

    def attempt(key, fn):
        try:
            info[key] = fn()
        except Exception as e:
            info[key] = "ERROR " + repr(e)[:600]

    C = getattr(T, "GlmMoeDsaConfig", None)
    info["GlmMoeDsaConfig.available"] = C is not None
    if C is None:
        return info
    attempt("GlmMoeDsaConfig.signature", lambda: str(inspect.signature(C))[:6000])
    attempt("GlmMoeDsaConfig().to_dict", lambda: json.loads(json.dumps(C().to_dict(), default=str)))
    mods = "transformers.models.glm_moe_dsa."
    for fn_name in (mods + "configuration_glm_moe_dsa:GlmMoeDsaConfig.__post_init__",
                    mods + "modeling_glm_moe_dsa:GlmMoeDsaIndexer.forward",
                    mods + "modeling_glm_moe_dsa:GlmMoeDsaAttention.__init__",
                    mods + "modeling_glm_moe_dsa:GlmMoeDsaAttention.forward",
                    mods + "modeling_glm_moe_dsa:GlmMoeDsaRotaryEmbedding.__init__",
                    mods + "modeling_glm_moe_dsa:GlmMoeDsaMoE.route_tokens_to_experts",
                    "transformers.modeling_rope_utils:_compute_yarn_parameters"):
        mod, _, attr = fn_name.partition(":")

        def src(mod=mod, attr=attr):
            import importlib
            obj = importlib.import_module(mod)
            for part in attr.split("."):
                obj = getattr(obj, part)
            return inspect.getsource(obj)[:7000]
        attempt("source:" + fn_name, src)
    for k, v in info.items():
        log(f"[explore-glm] {k}: {v if isinstance(v, str) else json.dumps(v, default=str)[:6000]}")
    return info


# ------------------------------------------------------------ build helpers --

def randomize_extra(model, seed, torch):
    g = torch.Generator().manual_seed(seed + 77)
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                v = torch.randn(tuple(b.shape), generator=g, dtype=torch.float32) * 0.25
                b.copy_(v.to(torch.bfloat16).to(b.dtype))


def fix_bias_dtype(path):
    """Store every e_score_correction_bias as F32 (as the GLM-5 checkpoints do)."""
    tensors, meta = fm.read_safetensors(path)
    changed = []
    for n, (dt, arr) in list(tensors.items()):
        if n.endswith("e_score_correction_bias") and dt != "F32":
            tensors[n] = ("F32", fm.to_f64(dt, arr).astype(np.float32))
            changed.append(n)
    if changed:
        fm.write_safetensors(path, tensors, meta)
    return changed


def config_hub(d, text):
    """Hub-style GLM-5 config: per-layer lists derived, legacy rope keys, ignored extras."""
    d.pop("mlp_layer_types", None)
    d.pop("layer_types", None)
    d.pop("indexer_types", None)
    d.pop("qk_head_dim", None)
    for k in ("index_topk_freq", "index_skip_topk_offset", "first_k_dense_replace"):
        if k in text:
            d[k] = text[k]
    rp = dict(d.pop("rope_parameters", None) or text["rope_parameters"])
    d["rope_theta"] = rp.pop("rope_theta")
    if rp.get("rope_type", "default") != "default":
        d["rope_scaling"] = rp
    d["head_dim"] = text["qk_nope_head_dim"] + text["qk_rope_head_dim"]  # like GLM-5.2: not the rope dim
    d.update({"rope_interleave": True, "indexer_rope_interleave": True,
              "num_nextn_predict_layers": 1, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
              "moe_layer_freq": 1})
    return ("config.json rewritten to the Hub form of GLM-5.x repos: no mlp_layer_types / "
            "layer_types / indexer_types (derived from first_k_dense_replace and "
            "index_topk_freq / index_skip_topk_offset), rope_theta + rope_scaling instead of "
            "rope_parameters, head_dim = nope + rope (ignored by transformers), extra keys "
            "rope_interleave, indexer_rope_interleave, num_nextn_predict_layers, scoring_func, "
            "topk_method, moe_layer_freq")


# ------------------------------------------------------------ numpy reference --

def _rms(x, w, eps):
    return w * (x / np.sqrt((x * x).mean(-1, keepdims=True) + eps))


def _ln(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def _rope(u, cos, sin, mode):
    """u [T, ..., d]; cos/sin [T, d/2]. 'inter': pairs (2j, 2j+1), output de-interleaved;
    'half': pairs (j, j+d/2). Output [rotated first halves ; rotated second halves]."""
    d = u.shape[-1]
    if mode == "inter":
        u1, u2 = u[..., 0::2], u[..., 1::2]
    else:
        u1, u2 = u[..., :d // 2], u[..., d // 2:]
    shape = (cos.shape[0],) + (1,) * (u.ndim - 2) + (cos.shape[1],)
    c, s = cos.reshape(shape), sin.reshape(shape)
    return np.concatenate([u1 * c - u2 * s, u2 * c + u1 * s], -1)


def _silu(x):
    return x / (1.0 + np.exp(-x))


def _topk_order(v):
    """indices by descending value, ties by lower index (the engine's documented rule)."""
    return np.lexsort((np.arange(len(v)), -v))


def np_forward(W, c, ids, cos, sin, scaling, mla_mode, idx_mode):
    T = len(ids)
    H, dn, dr, dv = c.num_attention_heads, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim
    rkv, ni, di, K = c.kv_lora_rank, c.index_n_heads, c.index_head_dim, c.index_topk
    E, G, Gk, k = c.n_routed_experts, c.n_group, c.topk_group, c.num_experts_per_tok
    info = {"dsa_gaps": [], "router_gaps": [], "group_gaps": [], "selections": 0}
    x = W["model.embed_tokens.weight"][np.array(ids)]
    causal = np.tril(np.ones((T, T), dtype=bool))
    sel = np.ones((T, T), dtype=bool)
    for l in range(c.num_hidden_layers):
        p = f"model.layers.{l}."
        a = p + "self_attn."
        h = _rms(x, W[p + "input_layernorm.weight"], c.rms_norm_eps)
        cq = _rms(h @ W[a + "q_a_proj.weight"].T, W[a + "q_a_layernorm.weight"], 1e-6)
        q = (cq @ W[a + "q_b_proj.weight"].T).reshape(T, H, dn + dr)
        qn, qr = q[..., :dn], _rope(q[..., dn:], cos, sin, mla_mode)
        ckv = h @ W[a + "kv_a_proj_with_mqa.weight"].T
        lat = _rms(ckv[:, :rkv], W[a + "kv_a_layernorm.weight"], 1e-6)
        kr = _rope(ckv[:, rkv:], cos, sin, mla_mode)
        kvb = W[a + "kv_b_proj.weight"].reshape(H, dn + dv, rkv)
        kn = np.einsum("sc,hdc->shd", lat, kvb[:, :dn])
        v = np.einsum("sc,hdc->shd", lat, kvb[:, dn:])
        sc = (np.einsum("thd,shd->hts", qn, kn) + np.einsum("thd,sd->hts", qr, kr)) * scaling
        if c.indexer_types[l] == "full":
            ki = _ln(h @ W[a + "indexer.wk.weight"].T, W[a + "indexer.k_norm.weight"],
                     W[a + "indexer.k_norm.bias"], 1e-6)
            ki = np.concatenate([_rope(ki[:, :dr], cos, sin, idx_mode), ki[:, dr:]], -1)
            qi = (cq @ W[a + "indexer.wq_b.weight"].T).reshape(T, ni, di)
            qi = np.concatenate([_rope(qi[..., :dr], cos, sin, idx_mode), qi[..., dr:]], -1)
            wt = (h @ W[a + "indexer.weights_proj.weight"].T) * ni ** -0.5
            score = np.einsum("tj,tjs->ts", wt,
                              np.maximum(np.einsum("tjd,sd->tjs", qi, ki) * di ** -0.5, 0.0))
            sel = np.zeros((T, T), dtype=bool)
            for t in range(T):
                if t + 1 <= K:
                    sel[t, :t + 1] = True
                    continue
                row = score[t, :t + 1]
                order = _topk_order(row)
                sel[t, order[:K]] = True
                info["dsa_gaps"].append(float(row[order[K - 1]] - row[order[K]]))
                info["selections"] += 1
        allowed = causal & sel
        sc = np.where(allowed[None], sc, -np.inf)
        sc = sc - sc.max(-1, keepdims=True)
        pr = np.exp(sc)
        pr /= pr.sum(-1, keepdims=True)
        o = np.einsum("hts,shv->thv", pr, v).reshape(T, H * dv)
        x = x + o @ W[a + "o_proj.weight"].T
        b = _rms(x, W[p + "post_attention_layernorm.weight"], c.rms_norm_eps)
        m = p + "mlp."

        def swiglu(pre, xx):
            return (_silu(xx @ W[pre + "gate_proj.weight"].T) * (xx @ W[pre + "up_proj.weight"].T)) \
                @ W[pre + "down_proj.weight"].T

        if c.mlp_layer_types[l] == "dense":
            x = x + swiglu(m, b)
            continue
        sg = 1.0 / (1.0 + np.exp(-(b @ W[m + "gate.weight"].T)))
        ch = sg + W[m + "gate.e_score_correction_bias"]
        y = swiglu(m + "shared_experts.", b)
        n = E // G
        for t in range(T):
            gs = np.sort(ch[t].reshape(G, n), -1)[:, -2:].sum(-1)
            go = _topk_order(gs)
            if Gk < G:
                info["group_gaps"].append(float(gs[go[Gk - 1]] - gs[go[Gk]]))
            chm = np.full(E, -np.inf)
            for g in go[:Gk]:
                chm[g * n:(g + 1) * n] = ch[t, g * n:(g + 1) * n]
            order = _topk_order(chm)
            idx = order[:k]
            if k < Gk * n:
                info["router_gaps"].append(float(chm[order[k - 1]] - chm[order[k]]))
            wts = sg[t, idx]
            if c.norm_topk_prob:
                wts = wts / (wts.sum() + 1e-20)
            wts = wts * c.routed_scaling_factor
            for e, we in sorted(zip(idx.tolist(), wts.tolist())):
                if m + "experts.gate_up_proj" in W:
                    gu = W[m + "experts.gate_up_proj"][e]
                    I = gu.shape[0] // 2
                    gw, uw, dw = gu[:I], gu[I:], W[m + "experts.down_proj"][e]
                else:
                    ep = m + f"experts.{e}."
                    gw, uw, dw = (W[ep + "gate_proj.weight"], W[ep + "up_proj.weight"],
                                  W[ep + "down_proj.weight"])
                y[t] += we * (dw @ (_silu(gw @ b[t]) * (uw @ b[t])))
        x = x + y
    xf = _rms(x, W["model.norm.weight"], c.rms_norm_eps)
    return xf @ W["lm_head.weight"].T, info


def _yarn_mine(rp, d, max_pos):
    """yarn per glm5.md §3.3 (own formula, compared with what transformers built)."""
    import math
    base, factor = rp["rope_theta"], rp["factor"]
    orig = rp.get("original_max_position_embeddings", max_pos)
    bf, bs = rp.get("beta_fast", 32), rp.get("beta_slow", 1)

    def corr(nrot):
        return d * math.log(orig / (nrot * 2 * math.pi)) / (2 * math.log(base))
    lo, hi = max(math.floor(corr(bf)), 0), min(math.ceil(corr(bs)), d - 1)
    if lo == hi:
        hi += 0.001
    j = np.arange(d // 2, dtype=np.float64)
    ramp = np.clip((j - lo) / (hi - lo), 0, 1)
    extra = 1.0 / base ** (np.arange(0, d, 2, dtype=np.float64) / d)
    inter = extra / factor
    m = 1 - ramp
    inv = inter * (1 - m) + extra * m

    def ms(f, mm=1.0):
        return 1.0 if f <= 1 else 0.1 * mm * math.log(f) + 1.0
    if rp.get("mscale") and rp.get("mscale_all_dim"):
        att = ms(factor, rp["mscale"]) / ms(factor, rp["mscale_all_dim"])
    else:
        att = ms(factor)
    return inv, att, ms(factor, rp.get("mscale_all_dim", 0) or 0) ** 2 if rp.get("mscale_all_dim") else 1.0


def check(model, ids, torch):
    """Numpy reference of the loaded (float64) HF model over ids: gaps + agreement."""
    c = model.config
    W = {k: v.detach().to(torch.float64).cpu().numpy() for k, v in model.state_dict().items()}
    rot = model.model.rotary_emb
    inv = rot.inv_freq.detach().to(torch.float64).cpu().numpy()
    att = float(getattr(rot, "attention_scaling", 1.0))
    scaling = float(model.model.layers[0].self_attn.scaling)
    pos = np.arange(len(ids), dtype=np.float64)
    ang = pos[:, None] * inv[None, :].astype(np.float32).astype(np.float64)
    cos, sin = np.cos(ang) * att, np.sin(ang) * att
    x = torch.tensor([ids], dtype=torch.long)
    with torch.no_grad():
        hf = model(input_ids=x, use_cache=False).logits[0].to(torch.float64).cpu().numpy()
    out = {"oracle_rope": {"inv_freq": inv.tolist(), "attention_scaling": att,
                           "attn_softmax_scale": scaling,
                           "qk_head_dim_pow_m05": float(c.qk_nope_head_dim + c.qk_rope_head_dim) ** -0.5,
                           "rope_parameters": json.loads(json.dumps(c.rope_parameters, default=str))}}
    variants, best = {}, None
    for mla in ("inter", "half"):
        for idx in ("inter", "half"):
            lg, info = np_forward(W, c, ids, cos, sin, scaling, mla, idx)
            rel = float(np.abs(lg - hf).max() / np.abs(hf).max())
            variants[f"mla_{mla}/indexer_{idx}"] = rel
            if best is None or rel < best[0]:
                best = (rel, mla, idx, info)
    rel, mla, idx, info = best
    out["numpy_ref_rel_diff_by_rope_pairing"] = variants
    out["rope_pairing"] = {"mla": mla, "indexer": idx, "numpy_vs_hf_rel": rel}
    out["min_dsa_gap"] = min(info["dsa_gaps"]) if info["dsa_gaps"] else None
    out["dsa_selections"] = info["selections"]
    out["min_router_choice_gap"] = min(info["router_gaps"]) if info["router_gaps"] else None
    out["min_group_gap"] = min(info["group_gaps"]) if info["group_gaps"] else None
    rp = c.rope_parameters or {}
    if rp.get("rope_type", "default") == "yarn":
        try:
            mi, ma, msc = _yarn_mine(rp, c.qk_rope_head_dim, c.max_position_embeddings)
            out["yarn_check"] = {"inv_freq_max_rel_diff": float(np.abs(mi - inv).max() / inv.max()),
                                 "attention_factor_mine": ma, "softmax_mscale2_mine": msc}
        except Exception as e:
            out["yarn_check"] = "ERROR " + repr(e)[:300]
    # gaps are only meaningful when the numpy model agrees with transformers; otherwise accept
    # the seed and let the C engine be the judge (the disagreement is recorded)
    out["numpy_ref_agrees"] = rel < 1e-5
    ok = (rel >= 1e-5 or (out["min_dsa_gap"] is None or out["min_dsa_gap"] >= DSA_GAP)
          and (out["min_router_choice_gap"] is None or out["min_router_choice_gap"] >= ROUTER_GAP)
          and (out["min_group_gap"] is None or out["min_group_gap"] >= ROUTER_GAP))
    return ok, out


def hf_incremental_rel(model, ids, n0, torch):
    """HF prefill(n0) + 1-token decodes vs HF full forward (tie-free => ~1e-7)."""
    x = torch.tensor([ids], dtype=torch.long)
    with torch.no_grad():
        full = model(input_ids=x, use_cache=False).logits[0]
        o = model(input_ids=x[:, :n0], use_cache=True)
        kv, outs = o.past_key_values, [o.logits[0]]
        for t in range(n0, len(ids)):
            o = model(input_ids=x[:, t:t + 1], past_key_values=kv, use_cache=True)
            kv = o.past_key_values
            outs.append(o.logits[0])
    inc = torch.cat(outs)
    return float(((inc - full).abs().max() / full.abs().max()).item())


# ------------------------------------------------------------ MLX copy -------

QUANT_LEAVES = {"q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "o_proj", "wq_b", "wk",
                "weights_proj", "gate_proj", "up_proj", "down_proj", "embed_tokens", "lm_head"}


def quantize_copy(model, tensors, plan, torch):
    """HF tensors (save_pretrained names) -> MLX tensors + quantization config; the model's
    weights are replaced by the dequantized values (the reference of the copy)."""
    c = model.config
    H, dn, dv, rkv = c.num_attention_heads, c.qk_nope_head_dim, c.v_head_dim, c.kv_lora_rank
    bits0, gs0, rules = plan["bits"], plan["group_size"], plan["rules"]
    qcfg = {"group_size": gs0, "bits": bits0, "mode": "affine"}
    out, deq, experts = {}, {}, {}

    emit = fm.mlx_emitter(bits0, gs0, rules, out, qcfg)

    for n, (dt, arr) in tensors.items():
        f32 = fm.to_f64(dt, arr).astype(np.float32)
        mt = re.match(r"(model\.layers\.\d+\.mlp\.)experts\.(\d+)\.(gate|up|down)_proj\.weight$", n)
        if mt:
            experts.setdefault((mt.group(1), mt.group(3)), {})[int(mt.group(2))] = f32
            continue
        if n.endswith("self_attn.kv_b_proj.weight"):
            w = f32.reshape(H, dn + dv, rkv)
            base = n[:-len("kv_b_proj.weight")]
            dk = emit(base + "embed_q", np.ascontiguousarray(w[:, :dn, :].transpose(0, 2, 1)))
            du = emit(base + "unembed_out", np.ascontiguousarray(w[:, dn:, :]))
            deq[n] = np.concatenate([dk.transpose(0, 2, 1), du], axis=1).reshape(H * (dn + dv), rkv)
            continue
        leaf = n.rsplit(".", 2)
        if n.endswith(".weight") and arr.ndim == 2 and leaf[-2] in QUANT_LEAVES:
            deq[n] = emit(n[:-len(".weight")], f32)
        else:
            out[n] = (dt, arr)
    params = dict(model.named_parameters(remove_duplicate=False))
    for (pre, proj), d in sorted(experts.items()):
        w = np.stack([d[e] for e in range(len(d))])
        dq = emit(pre + "switch_mlp." + proj + "_proj", w)
        if pre + "experts.gate_up_proj" in params:
            if proj == "down":
                deq[pre + "experts.down_proj"] = dq
            else:
                key = pre + "experts.gate_up_proj"
                cur = deq.get(key)
                if cur is None:
                    cur = params[key].detach().to(torch.float64).cpu().numpy().copy()
                I = cur.shape[1] // 2
                if proj == "gate":
                    cur[:, :I] = dq
                else:
                    cur[:, I:] = dq
                deq[key] = cur
        else:
            for e in range(dq.shape[0]):
                deq[pre + f"experts.{e}.{proj}_proj.weight"] = dq[e]
    with torch.no_grad():
        for n, d in deq.items():
            params[n].copy_(torch.from_numpy(np.ascontiguousarray(d)).to(params[n].dtype))
    return out, qcfg
