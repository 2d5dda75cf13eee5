#!/usr/bin/env python3
"""make_fixtures.py — build the model-parity fixtures (DESIGN.md §5) with HF transformers.

Runs on the GPU machine (python3 with torch, transformers, numpy; no network); the
reference itself is computed on the CPU in float64. For every case in fixtures_cases.py:

  1. build the transformers model from a tiny config, randomize *every* parameter
     (linear ~ N(0, 1/fan_in), embeddings N(0,1), norm weights 1 + 0.2 N, biases N(0, 0.5²),
     layer_scalar U(0.5,1.5), router scale U(0.5,1.5), per_expert_scale U(0.5,2), router
     proj N(0, 4)), cast to the storage dtype (bf16, or f32), save_pretrained();
  2. rewrite config.json into the form the case tests (Hub-flat Gemma 4 config, the
     per_layer_config form as written, Hub-style Llama rope_scaling), load the directory
     back with from_pretrained(dtype=float64, attn_implementation="eager"), check that
     every tensor of the file arrived unchanged and that the rewritten config gives the
     same logits as the in-memory model;
  3. greedy-decode 8 tokens by repeated full forwards (EOS ignored), then one forward
     over all ids -> ref_logits.f32 (float32 LE [T, vocab], after the final softcap);
  4. require a top-1/top-2 gap >= 0.003 on every row and >= 1e-3 between the k-th and
     (k+1)-th router logit of every MoE decision; otherwise re-seed (seed + 1009*attempt).
MLX cases additionally quantize the bf16 checkpoint with fixtures_mlx (MLX names, packing,
per-module overrides) and take as reference the model with the dequantized weights.
GLM-5 cases (glm=True) also go through fixtures_glm.py: router correction bias randomized and
stored F32, the Hub config form, an independent numpy forward that must agree with transformers
and whose DSA top-k / routing gaps decide whether the seed is tie-free, and the mlx-lm layout.

usage: python3 scripts/make_fixtures.py --out DIR [--only a,b] [--budget-s 240]
       python3 scripts/make_fixtures.py --out X --f32-check tests/parity/fixtures
"""
import argparse
import copy
import inspect
import json
import os
import re
import shutil
import sys
import tempfile
import time
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fixtures_mlx as fm  # noqa: E402
import fixtures_cases as fc  # noqa: E402
import fixtures_glm as fg  # noqa: E402

TOP_GAP = 0.003
ROUTER_GAP = 1e-3
N_NEW = 8
MAX_ATTEMPTS = 16
QUALITY_ATTEMPTS = 10

torch = None
T = None


def log(*a):
    print(*a, flush=True)


# ------------------------------------------------------------ exploration ----

def explore(out_root):
    info = {"transformers": T.__version__, "torch": torch.__version__, "numpy": np.__version__,
            "python": sys.version.split()[0]}
    names = ["Gemma4ForCausalLM", "Gemma4ForConditionalGeneration", "Gemma4TextConfig",
             "Gemma4Config", "Gemma4VisionConfig", "Gemma4UnifiedForCausalLM",
             "Gemma4UnifiedForConditionalGeneration", "Gemma4UnifiedConfig",
             "Gemma4UnifiedTextConfig", "Gemma4UnifiedVisionConfig", "LlamaForCausalLM",
             "Qwen3ForCausalLM", "Qwen2ForCausalLM"]
    info["classes"] = {n: hasattr(T, n) for n in names}

    def attempt(key, fn):
        try:
            info[key] = fn()
        except Exception as e:  # exploration must never stop the run
            info[key] = "ERROR " + repr(e)[:600]

    for cname in ("Gemma4TextConfig", "Gemma4UnifiedTextConfig", "Gemma4Config"):
        C = getattr(T, cname, None)
        if C is not None:
            attempt(cname + ".signature", lambda C=C: str(inspect.signature(C))[:4000])
    attempt("dense.to_dict", lambda: _jsonable(T.Gemma4TextConfig(**fc.DENSE).to_dict()))
    attempt("dense.head_dim", lambda: repr(T.Gemma4TextConfig(**fc.DENSE).head_dim))
    attempt("dense.per_layer_attributes",
            lambda: repr(getattr(T.Gemma4TextConfig(**fc.DENSE), "per_layer_attributes", None)))
    attempt("dense.to_json_string",
            lambda: T.Gemma4TextConfig(**fc.DENSE).to_json_string(use_diff=True)[:6000])
    attempt("llama.rope_scaling_form", lambda: {
        k: v for k, v in T.LlamaConfig(rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                                     "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                     "original_max_position_embeddings": 64},
                                       rope_theta=500000.0).to_dict().items() if "rope" in k})
    attempt("qwen3.to_dict", lambda: _jsonable(T.Qwen3Config(**fc.QWEN3).to_dict()))
    for fn_name in ("transformers.models.gemma4.configuration_gemma4:Gemma4TextConfig.__post_init__",
                    "transformers.modeling_rope_utils:_compute_proportional_rope_parameters",
                    "transformers.models.gemma4.modeling_gemma4:Gemma4TextAttention.__init__"):
        mod, _, attr = fn_name.partition(":")

        def src(mod=mod, attr=attr):
            import importlib
            obj = importlib.import_module(mod)
            for part in attr.split("."):
                obj = getattr(obj, part)
            return inspect.getsource(obj)[:5000]
        attempt("source:" + fn_name, src)
    glm_info = fg.explore(T, log)
    info.update({k: v for k, v in glm_info.items() if not k.startswith("source:")})
    for k, v in info.items():
        log(f"[explore] {k}: {v if isinstance(v, str) else json.dumps(v, default=str)[:5000]}")
    with open(os.path.join(out_root, "_oracle.json"), "w") as f:
        json.dump({k: v for k, v in info.items() if not k.startswith("source:")}, f, indent=1,
                  default=str)
    return info


def _jsonable(d):
    return json.loads(json.dumps(d, default=str))


# ------------------------------------------------------------ build ----------

def make_model(case, text):
    """-> (model, class name actually used)."""
    cls_name, cfg_name = case["cls"], case["cfg_cls"]
    if not hasattr(T, cls_name) and case.get("cls_fallback"):
        cls_name, cfg_name = case["cls_fallback"], case["cfg_cls_fallback"]
    try:
        return _build(cls_name, cfg_name, case, text), cls_name
    except Exception:
        if not case.get("cls_fallback") or cls_name == case["cls_fallback"]:
            raise
        log(f"[{case['name']}] {cls_name} failed, falling back:\n" + traceback.format_exc(limit=3))
        cls_name, cfg_name = case["cls_fallback"], case["cfg_cls_fallback"]
        return _build(cls_name, cfg_name, case, text), cls_name


def _build(cls_name, cfg_name, case, text):
    cfg_cls = getattr(T, cfg_name)
    if "vision" in case and not cfg_name.endswith("TextConfig"):
        text_cls = getattr(T, cfg_name.replace("Config", "TextConfig"))
        vis_cls = getattr(T, cfg_name.replace("Config", "VisionConfig"))
        cfg = cfg_cls(text_config=text_cls(**text), vision_config=vis_cls(**case["vision"]),
                      tie_word_embeddings=True)
    else:
        cfg = cfg_cls(**text)
    try:
        cfg._attn_implementation = "eager"
    except Exception:
        pass
    return getattr(T, cls_name)(cfg)


def randomize(model, seed):
    g = torch.Generator().manual_seed(seed)
    mods = dict(model.named_modules())
    nn = torch.nn

    def normal(shape, std):
        return torch.randn(shape, generator=g, dtype=torch.float32) * std

    def uniform(shape, lo, hi):
        return lo + (hi - lo) * torch.rand(shape, generator=g, dtype=torch.float32)

    with torch.no_grad():
        for name, p in model.named_parameters():
            modname, _, leaf = name.rpartition(".")
            mod = mods.get(modname)
            shape = tuple(p.shape)
            if name.endswith("router.scale"):
                v = uniform(shape, 0.5, 1.5)
            elif name.endswith("per_expert_scale"):
                v = uniform(shape, 0.5, 2.0)
            elif name.endswith("router.proj.weight"):
                v = normal(shape, 2.0)
            elif isinstance(mod, nn.Embedding):
                # rows of rms ~ 1/sqrt(width): with N(0,1) rows a tied head just predicts
                # the input token back (the embedding dominates the residual stream)
                v = normal(shape, shape[-1] ** -0.5)
            elif re.search(r"(^|\.)(model|language_model)\.norm\.weight$", name):
                v = 6.0 * (1.0 + 0.2 * normal(shape, 1.0))  # final norm: logits of std ~6
            elif leaf == "bias":
                v = normal(shape, 0.5)
            elif len(shape) >= 2:
                v = normal(shape, shape[-1] ** -0.5)
            else:  # norm weights and any other vector/scalar parameter
                v = 1.0 + 0.2 * normal(shape, 1.0)
            p.copy_(v.to(p.dtype))
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(uniform(tuple(b.shape), 0.5, 1.5).to(b.dtype))


def force_eager_experts(model):
    """grouped_mm (the default MoE kernel) has no float64 path: use the eager loop."""
    seen = set()
    cfgs = [getattr(m, "config", None) for m in model.modules()]
    cfgs.append(model.config)
    try:
        cfgs.append(model.config.get_text_config())
    except Exception:
        pass
    for c in cfgs:
        if c is None or id(c) in seen:
            continue
        seen.add(id(c))
        try:
            c._experts_implementation = "eager"
        except Exception:
            pass
    return model


def add_shared_kv_tensors(path, text, seed):
    """Add the unused k_proj/v_proj/k_norm of KV-shared layers, as Google's checkpoints have them."""
    tensors, meta = fm.read_safetensors(path)
    rng = np.random.default_rng(seed)
    n, s, hid = text["num_hidden_layers"], text["num_kv_shared_layers"], text["hidden_size"]
    added = []
    for l in range(n - s, n):
        full = text["layer_types"][l] == "full_attention"
        d = text["global_head_dim"] if full else text["head_dim"]
        keqv = full and text.get("attention_k_eq_v")
        nkv = text["num_global_key_value_heads"] if keqv else text["num_key_value_heads"]
        p = f"model.layers.{l}.self_attn."
        new = {p + "k_proj.weight": rng.standard_normal((nkv * d, hid)) * hid ** -0.5,
               p + "k_norm.weight": 1.0 + 0.2 * rng.standard_normal(d)}
        if not keqv:
            new[p + "v_proj.weight"] = rng.standard_normal((nkv * d, hid)) * hid ** -0.5
        for k, v in new.items():
            if k not in tensors:
                tensors[k] = ("BF16", fm.f32_to_bf16_bits(v))
                added.append(k)
    fm.write_safetensors(path, tensors, meta)
    return added


def round_like_storage(model, dtype):
    """In-place: round every persistent tensor through the storage dtype (keeps f32 buffers)."""
    with torch.no_grad():
        for _, p in model.named_parameters():
            p.copy_(p.to(dtype).to(p.dtype))
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(b.to(dtype).to(b.dtype))


# ------------------------------------------------------------ config forms ---

def text_of(d):
    return d["text_config"] if "text_config" in d else d


def config_hub_flat(d, text):
    tc = text_of(d)
    tc.pop("per_layer_config", None)
    tc["head_dim"] = text["head_dim"]
    tc["global_head_dim"] = text["global_head_dim"]
    tc["num_key_value_heads"] = text["num_key_value_heads"]
    tc["num_global_key_value_heads"] = text.get("num_global_key_value_heads")
    return "config.json rewritten to the Hub-flat form (no per_layer_config; head_dim, " \
           "global_head_dim, num_key_value_heads, num_global_key_value_heads)"


def config_per_layer(d, text):
    tc = text_of(d)
    if "per_layer_config" in tc:
        return "config.json exactly as save_pretrained wrote it (it contains per_layer_config)"
    blk = {}
    for i, lt in enumerate(text["layer_types"]):
        if lt == "full_attention":
            o = {"head_dim": text["global_head_dim"]}
            if text.get("attention_k_eq_v"):
                o["num_key_value_heads"] = text["num_global_key_value_heads"]
            blk[str(i)] = o
    tc["per_layer_config"] = blk
    return "save_pretrained wrote no per_layer_config: the block was added by hand"


def config_hub_rope_scaling(d, text):
    rp = dict(d.pop("rope_parameters", None) or text["rope_parameters"])
    d["rope_theta"] = rp.pop("rope_theta")
    d["rope_scaling"] = rp
    return "config.json rewritten to the Hub form: rope_scaling {rope_type: llama3, ...} + rope_theta"


CONFIG_FORMS = {"hub_flat": config_hub_flat, "per_layer": config_per_layer,
                "hub_rope_scaling": config_hub_rope_scaling, "as_saved": None,
                "glm_hub": fg.config_hub}


# ------------------------------------------------------------ reference ------

def load_ref(cls_name, d):
    cls = getattr(T, cls_name)
    try:
        m = cls.from_pretrained(d, dtype=torch.float64, attn_implementation="eager")
    except TypeError:
        m = cls.from_pretrained(d, torch_dtype=torch.float64, attn_implementation="eager")
    m = m.to(torch.float64)
    m.eval()
    return force_eager_experts(m)


def verify_loaded(model, path):
    tensors, _ = fm.read_safetensors(path)
    sd = model.state_dict()
    bad, missing = [], []
    for n, (dt, arr) in tensors.items():
        if n not in sd:
            missing.append(n)
            continue
        a = fm.to_f64(dt, arr)
        b = sd[n].detach().to(torch.float64).cpu().numpy()
        if a.shape != b.shape or not np.array_equal(a, b):
            bad.append(n)
    extra = [k for k in sd if k not in tensors]
    if bad:
        raise RuntimeError(f"loaded values differ from the file for {bad[:8]}")
    return {"file_names_not_in_model": missing, "model_names_not_in_file": extra}


def forward(model, ids):
    x = torch.tensor([ids], dtype=torch.long)
    with torch.no_grad():
        out = model(input_ids=x, use_cache=False)
    return out.logits[0].detach().to(torch.float64).cpu().numpy()


def greedy_reference(model, prompt, top_k):
    ids = list(prompt)
    for _ in range(N_NEW):
        ids.append(int(np.argmax(forward(model, ids)[-1])))
    captured = []
    hooks = [m.register_forward_hook(lambda _m, _i, o: captured.append(o.detach().double().cpu().numpy()))
             for n, m in model.named_modules() if n.endswith("router.proj")]
    try:
        logits = forward(model, ids)
    finally:
        for h in hooks:
            h.remove()
    arg = logits.argmax(axis=1)
    for t in range(len(prompt) - 1, len(ids) - 1):
        if arg[t] != ids[t + 1]:
            raise RuntimeError(f"final forward disagrees with greedy at row {t}")
    s = np.sort(logits, axis=1)
    top_gap = float((s[:, -1] - s[:, -2]).min())
    router_gap = None
    if captured:
        gaps = []
        for c in captured:
            c = c.reshape(-1, c.shape[-1])
            cs = -np.sort(-c, axis=1)
            gaps.append((cs[:, top_k - 1] - cs[:, top_k]).min())
        router_gap = float(min(gaps))
    return ids, logits, top_gap, router_gap


def make_prompt(seed, vocab, bos, n=None):
    rng = np.random.default_rng(seed)
    n = n or int(rng.integers(12, 17))
    return [int(bos)] + [int(x) for x in rng.integers(3, vocab, size=n - 1)]


def describe_file(path):
    tensors, meta = fm.read_safetensors(path)
    return {n: [dt, list(a.shape)] for n, (dt, a) in sorted(tensors.items())}, meta


# ------------------------------------------------------------ MLX copy -------

QUANT_LEAVES = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
                "per_layer_input_gate", "per_layer_projection", "per_layer_model_projection",
                "embed_tokens", "embed_tokens_per_layer"}


def mlx_convert(tensors, multimodal, plan):
    """HF tensors -> (MLX tensors, quantization config, {hf name: dequantized float64})."""
    bits0, gs0, rules = plan["bits"], plan["group_size"], plan["rules"]
    qcfg = {"group_size": gs0, "bits": bits0, "mode": "affine"}
    out, deq = {}, {}

    emit = fm.mlx_emitter(bits0, gs0, rules, out, qcfg)

    for n, (dt, arr) in tensors.items():
        if multimodal:
            if n.startswith("model.language_model."):
                m = "language_model.model." + n[len("model.language_model."):]
            elif n.startswith("lm_head."):
                m = "language_model." + n
            else:
                continue  # vision / audio towers: mlx-lm drops them
        else:
            m = n
        leaf = m.rsplit(".", 2)
        if m.endswith("experts.gate_up_proj"):
            w = fm.to_f64(dt, arr).astype(np.float32)
            half = w.shape[1] // 2
            base = m[:-len("gate_up_proj")] + "switch_glu."
            g = emit(base + "gate_proj", np.ascontiguousarray(w[:, :half]))
            u = emit(base + "up_proj", np.ascontiguousarray(w[:, half:]))
            deq[n] = np.concatenate([g, u], axis=1)
        elif m.endswith("experts.down_proj"):
            w = fm.to_f64(dt, arr).astype(np.float32)
            deq[n] = emit(m[:-len("down_proj")] + "switch_glu.down_proj", w)
        elif m.endswith(".weight") and arr.ndim == 2 and (
                leaf[-2] in QUANT_LEAVES or m.endswith("router.proj.weight")):
            deq[n] = emit(m[:-len(".weight")], fm.to_f64(dt, arr).astype(np.float32))
        else:
            out[m] = (dt, arr)
    return out, qcfg, deq


# ------------------------------------------------------------ one case -------

def run_case(case, out_root):
    name = case["name"]
    text = dict(case["text"])
    storage = torch.bfloat16 if case["storage"] == "bf16" else torch.float32
    tc_vocab = text["vocab_size"]
    top_k = text.get("top_k_experts") or 0
    fallback_applied = None
    for attempt in range(MAX_ATTEMPTS):
        seed = case["seed"] + 1009 * attempt
        dst = os.path.join(out_root, name)
        shutil.rmtree(dst, ignore_errors=True)
        work = tempfile.mkdtemp(prefix="fx_") if "mlx" in case else dst
        try:
            torch.manual_seed(seed)
            model, cls_name = make_model(case, text)
            force_eager_experts(model)
            randomize(model, seed)
            if case.get("glm"):
                fg.randomize_extra(model, seed, torch)
            inmem = copy.deepcopy(model)
            round_like_storage(inmem, storage)
            inmem = inmem.to(torch.float64).eval()
            model = model.to(storage)
            model.save_pretrained(work)
            del model
            cpath = os.path.join(work, "config.json")
            with open(cpath) as f:
                saved_cfg = json.load(f)
            cfg = copy.deepcopy(saved_cfg)
            form = CONFIG_FORMS[case["config_form"]]
            cfg_note = form(cfg, text) if form else "config.json as written by save_pretrained"
            with open(cpath, "w") as f:
                json.dump(cfg, f, indent=2)
            if case.get("glm"):
                fg.fix_bias_dtype(os.path.join(work, "model.safetensors"))
            if case.get("add_shared_kv"):
                added = add_shared_kv_tensors(os.path.join(work, "model.safetensors"), text, seed)
                cfg_note += (". transformers 5.17 writes no k_proj/v_proj/k_norm for KV-shared "
                             "layers; these unused tensors were added by hand (random values) as "
                             "Google's released checkpoints carry them: " + ", ".join(added))
            ref = load_ref(cls_name, work)
            ver = verify_loaded(ref, os.path.join(work, "model.safetensors"))
            prompt = make_prompt(seed, tc_vocab, text["bos_token_id"], case.get("prompt_len"))
            a, b = forward(inmem, prompt), forward(ref, prompt)
            inmem_diff = float(np.abs(a - b).max() / max(np.abs(a).max(), 1e-30))
            if inmem_diff > 1e-3 and form is not None:
                log(f"[{name}] rewritten config.json changes the model (rel diff {inmem_diff:.3g}); "
                    "reverting to the config as saved")
                cfg = copy.deepcopy(saved_cfg)
                cfg_note = (f"the rewritten config form changed the logits (rel diff {inmem_diff:.3g}),"
                            " so config.json is as written by save_pretrained")
                with open(cpath, "w") as f:
                    json.dump(cfg, f, indent=2)
                ref = load_ref(cls_name, work)
                b = forward(ref, prompt)
                inmem_diff = float(np.abs(a - b).max() / max(np.abs(a).max(), 1e-30))
            del inmem
            extra = {}
            if "mlx" in case:
                tensors, _ = fm.read_safetensors(os.path.join(work, "model.safetensors"))
                before = forward(ref, prompt)
                if case.get("glm"):
                    mt, qcfg = fg.quantize_copy(ref, tensors, case["mlx"], torch)
                else:
                    mt, qcfg, deq = mlx_convert(tensors, "text_config" in cfg, case["mlx"])
                    params = dict(ref.named_parameters(remove_duplicate=False))
                    params.update(dict(ref.named_buffers()))
                    with torch.no_grad():
                        for n, d in deq.items():
                            params[n].copy_(torch.from_numpy(d).to(params[n].dtype))
                after = forward(ref, prompt)
                extra["quantization_effect_rel_diff"] = float(
                    np.linalg.norm(after - before) / np.linalg.norm(before))
                os.makedirs(dst, exist_ok=True)
                total = fm.write_safetensors(os.path.join(dst, "model.safetensors"), mt,
                                             {"format": "mlx"})
                with open(os.path.join(dst, "model.safetensors.index.json"), "w") as f:
                    json.dump({"metadata": {"total_size": total},
                               "weight_map": {k: "model.safetensors" for k in sorted(mt)}}, f, indent=2)
                qcfg_out = dict(cfg)
                qcfg_out["quantization"] = qcfg
                qcfg_out["quantization_config"] = qcfg
                with open(os.path.join(dst, "config.json"), "w") as f:
                    json.dump(qcfg_out, f, indent=2)
                extra["quantization"] = qcfg
                extra["reference_weights"] = ("every quantized weight replaced by its float64 "
                                              "dequantization scale*q+bias from the stored bf16 "
                                              "scales/biases; other tensors as stored (bf16)")
            ids, logits, top_gap, router_gap = greedy_reference(ref, prompt, top_k)
            ok = top_gap >= TOP_GAP and (router_gap is None or router_gap >= ROUTER_GAP)
            if case.get("glm"):
                try:
                    ok_g, gi = fg.check(ref, ids, torch)
                except Exception:
                    ok_g, gi = True, {"glm_check_error": traceback.format_exc()[-1500:]}
                try:
                    gi["hf_incremental_vs_full_rel"] = fg.hf_incremental_rel(ref, ids, len(prompt), torch)
                except Exception as e:
                    gi["hf_incremental_vs_full_rel"] = "ERROR " + repr(e)[:300]
                log(f"[{name}] glm check ok={ok_g}: " + json.dumps(
                    {k: v for k, v in gi.items() if k != "oracle_rope"}, default=str)[:3000])
                extra.update(gi)
                ok = ok and ok_g
            # prefer non-degenerate references: a varied continuation, and rows that do not
            # simply predict their own input token (checked on the first attempts only)
            n_distinct = len(set(ids[len(prompt):]))
            self_rows = float(np.mean(logits.argmax(axis=1) == np.array(ids)))
            if attempt < QUALITY_ATTEMPTS and (n_distinct < 3 or self_rows > 0.5):
                ok = False
            log(f"[{name}] attempt {attempt} seed {seed}: top_gap {top_gap:.4g} router_gap "
                f"{router_gap} inmem_diff {inmem_diff:.3g} distinct {n_distinct} "
                f"self_rows {self_rows:.2f} ok={ok}")
            if not ok:
                continue
            emb = None
            for n, b_ in ref.named_buffers():
                if n.endswith("embed_tokens.embed_scale"):
                    emb = float(b_.double())
            tens, meta = describe_file(os.path.join(dst, "model.safetensors"))
            refj = {
                "case": name, "prompt_ids": prompt, "all_ids": ids,
                "logits_shape": [len(ids), int(logits.shape[1])],
                "transformers": T.__version__, "torch": torch.__version__, "dtype_ref": "float64",
                "notes": case["notes"] + ". " + cfg_note + "." +
                         (f" Fallback applied: {fallback_applied}." if fallback_applied else ""),
                "seed": seed, "attempt": attempt, "model_class": cls_name,
                "storage_dtype": "MLX affine (uint32 + bf16 scales/biases) + bf16" if "mlx" in case
                else case["storage"],
                "reference_load": "from_pretrained(dir, dtype=torch.float64, "
                                  "attn_implementation='eager'), CPU, use_cache=False",
                "min_top2_gap": top_gap, "min_router_gap": router_gap,
                "distinct_generated": n_distinct, "rows_predicting_own_token": self_rows,
                "n_generated": N_NEW, "config_form": case["config_form"],
                "config_as_saved_by_transformers": saved_cfg,
                "embed_scale_in_reference": emb,
                "load_check": ver, "inmem_vs_loaded_rel_diff": inmem_diff,
                "safetensors_metadata": meta,
            }
            refj.update(extra)
            with open(os.path.join(dst, "ref.json"), "w") as f:
                json.dump(refj, f, indent=1)
            logits.astype("<f4").tofile(os.path.join(dst, "ref_logits.f32"))
            log(f"[{name}] tensors: " + json.dumps(tens))
            log(f"[{name}] load_check: {json.dumps(ver)}")
            return {"status": "ok", "seed": seed, "attempt": attempt, "top_gap": top_gap,
                    "router_gap": router_gap, "class": cls_name, "bytes": dir_bytes(dst)}
        except Exception:
            tb = traceback.format_exc()
            log(f"[{name}] attempt {attempt} FAILED:\n{tb}")
            if case.get("on_error_text") and not fallback_applied:
                fallback_applied = json.dumps(case["on_error_text"])
                text.update(case["on_error_text"])
                continue
            shutil.rmtree(dst, ignore_errors=True)
            return {"status": "error", "error": tb[-2000:]}
        finally:
            if work != dst:
                shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(os.path.join(out_root, name), ignore_errors=True)
    return {"status": "error", "error": f"no tie-free seed in {MAX_ATTEMPTS} attempts"}


def dtype_check(root, dt_name, out_json=""):
    """Load every HF-layout fixture under root in float32 or bfloat16 and report its distance to the
    float64 reference: what transformers itself achieves in that dtype (the bf16 figure states the
    bound of tern's bf16 compute mode, tests/unit/test_parity.c). out_json: the per-case figures."""
    dt = {"f32": torch.float32, "bf16": torch.bfloat16}[dt_name]
    res = {}
    for case in fc.CASES:
        d = os.path.join(root, case["name"])
        if "mlx" in case or not os.path.isfile(os.path.join(d, "ref.json")):
            continue
        with open(os.path.join(d, "ref.json")) as f:
            r = json.load(f)
        if r.get("model_class") is None or not hasattr(T, r["model_class"]):
            continue
        cls = getattr(T, r["model_class"])
        m = force_eager_experts(cls.from_pretrained(d, dtype=dt, attn_implementation="eager").eval())
        x = forward(m, r["all_ids"])
        ref = np.fromfile(os.path.join(d, "ref_logits.f32"), dtype="<f4").reshape(r["logits_shape"])
        rel = np.linalg.norm(x - ref, axis=1) / np.linalg.norm(ref, axis=1)
        same = int((x.argmax(1) == ref.argmax(1)).sum())
        res[case["name"]] = {"max_rel_l2": float(rel.max()), "mean_rel_l2": float(rel.mean()),
                             "argmax_equal": same, "rows": len(rel)}
        log(f"[{dt_name}-check] {case['name']}: transformers {dt_name} vs reference: max rel_L2 "
            f"{rel.max():.2e} (mean {rel.mean():.2e}), argmax equal {same}/{len(rel)}")
    if out_json:
        with open(out_json, "w") as f:
            json.dump({"transformers": T.__version__, "torch": torch.__version__, "dtype": dt_name,
                       "cases": res}, f, indent=1)


def dir_bytes(d):
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))


def main():
    global torch, T
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="")
    ap.add_argument("--budget-s", type=float, default=240.0)
    ap.add_argument("--f32-check", default="", help="fixtures dir: compare transformers f32 with it")
    ap.add_argument("--bf16-check", default="", help="fixtures dir: compare transformers bf16 with it")
    ap.add_argument("--check-json", default="", help="with --f32-check/--bf16-check: write the figures here")
    args = ap.parse_args()
    t0 = time.time()
    import torch as _torch
    import transformers as _T
    torch, T = _torch, _T
    torch.set_num_threads(min(8, os.cpu_count() or 1))
    try:
        T.logging.set_verbosity_error()
    except Exception:
        pass
    if args.f32_check or args.bf16_check:
        dtype_check(args.f32_check or args.bf16_check, "f32" if args.f32_check else "bf16", args.check_json)
        return
    os.makedirs(args.out, exist_ok=True)
    explore(args.out)
    only = [s for s in args.only.split(",") if s]
    manifest = {"transformers": T.__version__, "torch": torch.__version__, "cases": {}}
    for case in fc.CASES:
        if only and case["name"] not in only:
            continue
        if time.time() - t0 > args.budget_s:
            manifest["cases"][case["name"]] = {"status": "skipped", "error": "time budget"}
            continue
        t1 = time.time()
        r = run_case(case, args.out)
        r["seconds"] = round(time.time() - t1, 1)
        manifest["cases"][case["name"]] = r
        log(f"[{case['name']}] -> {r['status']} in {r['seconds']} s")
        with open(os.path.join(args.out, "MANIFEST.json"), "w") as f:
            json.dump(manifest, f, indent=1)
    log("SUMMARY " + json.dumps({k: (v["status"], v.get("bytes")) for k, v in manifest["cases"].items()}))
    log(f"total {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
