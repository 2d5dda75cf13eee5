#!/usr/bin/env python3
"""
peer_transformers.py — transformers on the same GPU and the same random-weight geometry as tern's
benchmarks (issue 4 names transformers 5.17 as a peer next to llama.cpp).

The model is built from a tern preset's config.json (`tern-core info --random NAME --config`), so both
engines run one geometry: LlamaForCausalLM for llama presets, Gemma4ForCausalLM for gemma4_text ones,
random bf16 weights created on the GPU (no files). Each timing is bracketed by torch.cuda.synchronize
and preceded by an untimed warm-up of the same shape:
  prefill  one forward over P random ids, logits of the last position only (P in --prompt);
  decode   generate() of --gen new tokens, greedy, EOS off (min_new_tokens = max_new_tokens), after a
           --ctx-token random prompt, for each batch size B in --batch; the prompt's forward at that
           batch is timed separately and subtracted: tok/s = B * gen / (generate - prefill).
Prints a table and `csv,transformers,NAME,prefill|decode,P|B,tok_s` lines. `--compile` adds
generate(cache_implementation="static") with torch.compile of the forward (transformers' fast path;
first calls compile for minutes). Usage on the GPU machine:
  python3 bench/peer_transformers.py --tern build/tern-core --preset llama3-8b --prompt 512,4096 --batch 1,64
"""
import argparse
import json
import subprocess
import time

import torch
import transformers


def build(tern, preset, attn):
    cfg = json.loads(subprocess.check_output([tern, "info", "--random", preset, "--config"]))
    mt = cfg.pop("model_type")
    cfg.pop("architectures", None)
    if mt == "llama":
        ccls, mcls = transformers.LlamaConfig, transformers.LlamaForCausalLM
    elif mt == "gemma4_text":
        ccls, mcls = transformers.Gemma4TextConfig, transformers.Gemma4ForCausalLM
    else:
        raise SystemExit(f"peer_transformers: model_type {mt} is not wired here")
    config = ccls(**cfg)
    config._attn_implementation = attn
    torch.manual_seed(0)
    with torch.device("cuda"):
        try:
            model = mcls._from_config(config, dtype=torch.bfloat16)
        except TypeError:  # older keyword
            model = mcls._from_config(config, torch_dtype=torch.bfloat16)
    model.eval()
    for p in model.parameters():  # small random weights (the default init leaves some at zero)
        p.data.normal_(0.0, 0.02)
    return model, config


def timed(fn, reps=1):
    fn()  # warm-up of this shape
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps


@torch.inference_mode()
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tern", default="build/tern-core")
    ap.add_argument("--preset", default="llama3-8b")
    ap.add_argument("--prompt", default="512,4096")
    ap.add_argument("--batch", default="1,64")
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--attn", default="sdpa")
    ap.add_argument("--compile", action="store_true")
    a = ap.parse_args()
    model, config = build(a.tern, a.preset, a.attn)
    V = config.vocab_size
    dev = torch.device("cuda")
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, {torch.cuda.get_device_name(0)}, "
          f"{a.preset}, attention {a.attn}, {sum(p.numel() for p in model.parameters()) / 1e9:.2f} B parameters")
    rows = []
    for P in [int(x) for x in a.prompt.split(",") if x]:
        ids = torch.randint(0, V, (1, P), device=dev)
        t = timed(lambda: model(input_ids=ids, logits_to_keep=1))
        rows.append(("prefill", P, P / t))
    gk = dict(max_new_tokens=a.gen, min_new_tokens=a.gen, do_sample=False, eos_token_id=None, pad_token_id=0)
    if a.compile:
        gk["cache_implementation"] = "static"
        model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=False)
    for B in [int(x) for x in a.batch.split(",") if x]:
        ids = torch.randint(0, V, (B, a.ctx), device=dev)
        mask = torch.ones_like(ids)
        tp = timed(lambda: model(input_ids=ids, attention_mask=mask, logits_to_keep=1))
        tg = timed(lambda: model.generate(input_ids=ids, attention_mask=mask, **gk))
        rows.append(("decode", B, B * a.gen / max(tg - tp, 1e-9)))
    print(f"{'what':<8} {'P|B':>6} {'tok/s':>10}")
    for what, n, v in rows:
        print(f"{what:<8} {n:>6} {v:>10.1f}")
    for what, n, v in rows:
        print(f"csv,transformers,{a.preset},{what},{n},{v:.2f}")


if __name__ == "__main__":
    main()
