"""fixtures_cases.py — the tiny model geometries behind tests/parity/fixtures (see make_fixtures.py).

Each case is a dict: name, seed, how to build the model (transformers class name + config
kwargs), the on-disk storage dtype, how config.json is written (Hub-flat form, the
per_layer_config form, Hub-style rope_scaling), and for MLX copies the quantization plan.

Geometry rules (DESIGN.md §5 / the fixtures brief): hidden 64, vocab 256, 4-6 layers,
head_dim 16-32, global_head_dim 32-64, sliding_window 6-8, so that every fixture is small
and every prompt (12-16 tokens + 8 generated) is longer than the sliding window. Every
input dimension is divisible by the quantization group sizes used on it.
"""

V = 256
H = 64

ROPE_GEMMA4 = {
    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                       "rope_theta": 1000000.0},
}


def layer_types(n, full_every):
    return ["full_attention" if (i % full_every) == full_every - 1 else "sliding_attention"
            for i in range(n)]


def gemma4_text(**over):
    """Gemma4TextConfig kwargs; flat Hub-style names (global_head_dim, num_global_key_value_heads)."""
    kw = dict(
        vocab_size=V, hidden_size=H, intermediate_size=128, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, global_head_dim=64,
        hidden_activation="gelu_pytorch_tanh", max_position_embeddings=512,
        rms_norm_eps=1e-6, pad_token_id=0, eos_token_id=1, bos_token_id=2,
        tie_word_embeddings=True, rope_parameters=ROPE_GEMMA4, attention_bias=False,
        sliding_window=8, layer_types=layer_types(6, 3), final_logit_softcapping=30.0,
        vocab_size_per_layer_input=V, hidden_size_per_layer_input=0,
        attention_k_eq_v=False, num_global_key_value_heads=None, num_kv_shared_layers=0,
        enable_moe_block=False, use_double_wide_mlp=False,
    )
    kw.update(over)
    if "num_hidden_layers" in over and "layer_types" not in over:
        kw["layer_types"] = layer_types(kw["num_hidden_layers"], 3)
    return kw


DENSE = gemma4_text()

E2B = gemma4_text(
    intermediate_size=64, hidden_size_per_layer_input=16, num_kv_shared_layers=3,
    use_double_wide_mlp=True, sliding_window=7, num_key_value_heads=1,
)  # layers [s,s,F | s,s,F]: shared 3..5, donors: sliding 1, full 2

MOE = gemma4_text(
    num_hidden_layers=4, layer_types=layer_types(4, 2), intermediate_size=64,
    attention_k_eq_v=True, num_global_key_value_heads=1, num_key_value_heads=2,
    enable_moe_block=True, num_experts=8, top_k_experts=2, moe_intermediate_size=32,
    sliding_window=6, use_bidirectional_attention="vision",
)

PERLAYER = gemma4_text(
    attention_k_eq_v=True, num_global_key_value_heads=1, num_key_value_heads=2,
    sliding_window=6,
)

F32 = gemma4_text(
    num_attention_heads=8, num_key_value_heads=2, head_dim=16, global_head_dim=32,
    intermediate_size=96, sliding_window=8,
)

UNIFIED_TEXT = dict(
    vocab_size=V, hidden_size=H, intermediate_size=128, num_hidden_layers=6,
    num_attention_heads=4, num_key_value_heads=2, head_dim=32, global_head_dim=64,
    num_global_key_value_heads=1, attention_k_eq_v=True, hidden_activation="gelu_pytorch_tanh",
    max_position_embeddings=512, rms_norm_eps=1e-6, pad_token_id=0, eos_token_id=1,
    bos_token_id=2, tie_word_embeddings=True, rope_parameters=ROPE_GEMMA4,
    attention_bias=False, sliding_window=8, layer_types=layer_types(6, 3),
    final_logit_softcapping=30.0, use_bidirectional_attention="vision",
    num_kv_shared_layers=0, use_double_wide_mlp=False,
)

GEMMA4_VISION = dict(
    hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
    num_key_value_heads=2, head_dim=16, patch_size=4, pooling_kernel_size=2,
    position_embedding_size=16,
)

UNIFIED_VISION = dict(patch_size=4, pooling_kernel_size=2, mm_embed_dim=H, mm_posemb_size=8,
                      output_proj_dims=H)

LLAMA3 = dict(
    vocab_size=V, hidden_size=H, intermediate_size=128, num_hidden_layers=4,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, hidden_act="silu",
    max_position_embeddings=512, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2,
    tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
    rope_parameters={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 64,
                     "rope_theta": 500000.0},
)

QWEN3 = dict(
    vocab_size=V, hidden_size=H, intermediate_size=128, num_hidden_layers=4,
    num_attention_heads=4, num_key_value_heads=2, head_dim=32, hidden_act="silu",
    max_position_embeddings=512, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2,
    tie_word_embeddings=True, attention_bias=False,
    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
)

QWEN2 = dict(
    vocab_size=V, hidden_size=H, intermediate_size=128, num_hidden_layers=4,
    num_attention_heads=4, num_key_value_heads=2, hidden_act="silu",
    max_position_embeddings=512, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2,
    tie_word_embeddings=False, use_sliding_window=False,
    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
)

# MLX quantization plans: list of (regex on the stored module path, value); first match wins;
# value None = the default (bits, group_size); False = stored unquantized; (bits, gs) = override.
MIXED_RULES = [
    (r"\.router\.proj$", (8, 64)),
    (r"layers\.1\.mlp\.(gate|up|down)_proj$", (6, 32)),
    (r"\.embed_tokens$", (5, 32)),
    (r"layers\.2\.self_attn\.q_proj$", (3, 32)),
    (r"layers\.3\.self_attn\.o_proj$", (2, 64)),
    (r"layers\.2\.experts\.switch_glu\.gate_proj$", (8, 64)),
    (r"layers\.0\.experts\.switch_glu\.down_proj$", (6, 32)),
    (r"layers\.0\.self_attn\.k_proj$", False),
]

E2B_Q = dict(E2B, hidden_size_per_layer_input=32)  # P=32 so every PLE input dim divides by 32

CASES = [
    dict(name="gemma4_dense", seed=101, cls="Gemma4ForCausalLM", cfg_cls="Gemma4TextConfig",
         text=DENSE, storage="bf16", config_form="hub_flat",
         notes="text-only Gemma4ForCausalLM, tensors under model.; sliding + full layers "
               "(full at l%3==2), proportional RoPE (p=0.25) on full layers, softcap 30, tied head"),
    dict(name="gemma4_e2b_like", seed=202, cls="Gemma4ForCausalLM", cfg_cls="Gemma4TextConfig",
         text=E2B, storage="bf16", config_form="hub_flat", add_shared_kv=True,
         notes="E2B-like: PLE P=16, num_kv_shared_layers=3 over [s,s,F,s,s,F] (shared 3,4,5; "
               "donors sliding=1 full=2), use_double_wide_mlp (shared layers MLP 2*I), nKV=1"),
    dict(name="gemma4_moe_like", seed=303, cls="Gemma4ForConditionalGeneration",
         cfg_cls="Gemma4Config", text=MOE, vision=GEMMA4_VISION, storage="bf16",
         config_form="hub_flat", on_error_text=dict(use_bidirectional_attention=None),
         notes="26B-like in the multimodal layout (model.language_model.*, nested text_config, a "
               "tiny vision tower whose tensors are in the file and must be skipped): "
               "enable_moe_block, 8 experts top-2, moe_intermediate 32, attention_k_eq_v with "
               "num_global_key_value_heads=1 on full layers"),
    dict(name="gemma4_perlayer", seed=404, cls="Gemma4ForCausalLM", cfg_cls="Gemma4TextConfig",
         text=PERLAYER, storage="bf16", config_form="per_layer",
         notes="config.json exactly as transformers writes it (per_layer_config form when the "
               "version writes one); attention_k_eq_v + num_global_key_value_heads=1 so the "
               "per-layer block overrides both head_dim and num_key_value_heads"),
    dict(name="gemma4_unified", seed=505, cls="Gemma4UnifiedForConditionalGeneration",
         cls_fallback="Gemma4UnifiedForCausalLM", cfg_cls="Gemma4UnifiedConfig",
         cfg_cls_fallback="Gemma4UnifiedTextConfig", text=UNIFIED_TEXT, vision=UNIFIED_VISION,
         storage="bf16", config_form="hub_flat",
         on_error_text=dict(use_bidirectional_attention=None),
         notes="12B-style gemma4_unified: Gemma4 decoder without PLE/MoE, attention_k_eq_v"),
    dict(name="gemma4_f32", seed=606, cls="Gemma4ForCausalLM", cfg_cls="Gemma4TextConfig",
         text=F32, storage="f32", config_form="hub_flat",
         notes="like gemma4_dense but weights stored as F32, 8 query heads over 2 kv heads "
               "(GQA ratio 4), head_dim 16 / global_head_dim 32"),
    dict(name="llama3", seed=707, cls="LlamaForCausalLM", cfg_cls="LlamaConfig", text=LLAMA3,
         storage="bf16", config_form="hub_rope_scaling",
         notes="Llama 3 rope scaling (factor 8, low 1, high 4, original_max_position_embeddings "
               "64, theta 5e5; with head_dim 16 the 8 frequencies fall in all three bands), "
               "GQA 4/2, untied lm_head; config.json in the Hub form (rope_scaling + rope_theta)"),
    dict(name="qwen3", seed=808, cls="Qwen3ForCausalLM", cfg_cls="Qwen3Config", text=QWEN3,
         storage="bf16", config_form="as_saved",
         notes="Qwen3: q_norm/k_norm per head, head_dim 32 (nH*D=128 != hidden 64), tied embeddings"),
    dict(name="qwen2", seed=909, cls="Qwen2ForCausalLM", cfg_cls="Qwen2Config", text=QWEN2,
         storage="bf16", config_form="as_saved",
         notes="Qwen2: q/k/v biases (randomized), GQA 4/2, untied lm_head"),
    dict(name="gemma4_dense_q4g64", seed=1111, cls="Gemma4ForCausalLM",
         cfg_cls="Gemma4TextConfig", text=DENSE, storage="bf16", config_form="hub_flat",
         mlx=dict(bits=4, group_size=64, rules=[]),
         notes="MLX affine 4-bit group 64: every linear + embed_tokens (the tied head uses the "
               "quantized embedding), names model.*"),
    dict(name="gemma4_e2b_q8g32", seed=1212, cls="Gemma4ForCausalLM",
         cfg_cls="Gemma4TextConfig", text=E2B_Q, storage="bf16", config_form="hub_flat",
         mlx=dict(bits=8, group_size=32, rules=[]),
         notes="MLX affine 8-bit group 32 of an E2B-like model (P=32) incl. "
               "embed_tokens_per_layer and per_layer_model_projection, names model.*"),
    dict(name="gemma4_moe_mixed", seed=1313, cls="Gemma4ForConditionalGeneration",
         cfg_cls="Gemma4Config", text=MOE, vision=GEMMA4_VISION, storage="bf16",
         config_form="hub_flat", mlx=dict(bits=4, group_size=32, rules=MIXED_RULES),
         on_error_text=dict(use_bidirectional_attention=None),
         notes="MLX mixed quantization of the MoE model, names language_model.model.*, experts "
               "split into experts.switch_glu.{gate,up,down}_proj; default 4-bit g32, per-module "
               "overrides with 2/3/5/6/8 bits and one module stored unquantized (false)"),
]

# ---------------------------------------------------------------- GLM-5 (glm_moe_dsa) --------
# Tiny GLM-5 geometries (glm5.md; fixtures_glm.py). Sequences are longer than index_topk so the
# DSA selection is active on the later rows; 8 indexer heads and 1/sqrt(fan_in) weights keep
# the index scores tie-free. Every quantized input dim divides by 32 (d_n = 32 for embed_q).
GLM5 = dict(
    vocab_size=V, hidden_size=H, intermediate_size=96, moe_intermediate_size=32,
    num_hidden_layers=5, num_attention_heads=4, num_key_value_heads=4,
    n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=3, n_group=2, topk_group=1,
    kv_lora_rank=32, q_lora_rank=64, qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=16,
    first_k_dense_replace=2, index_topk=8, index_head_dim=32, index_n_heads=8,
    indexer_types=["full", "shared", "full", "shared", "shared"],
    max_position_embeddings=512, rope_parameters={"rope_theta": 10000.0, "rope_type": "default"},
    routed_scaling_factor=2.5, norm_topk_prob=True, rms_norm_eps=1e-5,
    bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False,
)

# GLM-5.2-like derived lists (index_topk_freq 2, offset 2 -> [F, F, S, F]), yarn RoPE, no
# normalization of the routed weights, two shared experts, one group, the other eps.
GLM5_YARN = dict(
    GLM5, num_hidden_layers=4, first_k_dense_replace=1, indexer_types=None,
    index_topk_freq=2, index_skip_topk_offset=2, index_topk=10,
    n_group=1, topk_group=1, num_experts_per_tok=2, n_shared_experts=2, moe_intermediate_size=16,
    norm_topk_prob=False, routed_scaling_factor=1.5, rms_norm_eps=1e-6,
    max_position_embeddings=512,
    rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                     "original_max_position_embeddings": 128, "mscale": 1.0,
                     "mscale_all_dim": 0.8, "beta_fast": 32.0, "beta_slow": 1.0},
)

# index_topk >= every sequence length: DSA is a no-op (pure dense MLA); GLM-5 style all-full.
GLM5_DENSE = dict(
    GLM5, num_hidden_layers=3, first_k_dense_replace=1, indexer_types=None, index_topk=64,
    n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2, moe_intermediate_size=16,
    rope_parameters={"rope_theta": 1000000.0, "rope_type": "default"},
)

GLM5_Q_RULES = [
    (r"indexer\.weights_proj$", (8, 64)),
    (r"layers\.0\.self_attn\.embed_q$", (6, 32)),
    (r"layers\.3\.self_attn\.unembed_out$", (8, 32)),
    (r"layers\.2\.mlp\.switch_mlp\.down_proj$", (8, 32)),
    (r"^lm_head$", (6, 64)),
    (r"layers\.1\.self_attn\.kv_a_proj_with_mqa$", False),
]

CASES += [
    dict(name="glm5_dsa", seed=2101, cls="GlmMoeDsaForCausalLM", cfg_cls="GlmMoeDsaConfig",
         text=GLM5, storage="bf16", config_form="as_saved", glm=True, prompt_len=24,
         notes="GLM-5.2-like glm_moe_dsa: MLA (q_lora 64, kv_lora 32, nope 32, rope 16, v 16, "
               "4 heads), DSA indexer 8 heads x 32, index_topk 8 < 32 tokens, indexer_types "
               "[full, shared, full, shared, shared], 2 dense layers then MoE (8 experts, "
               "2 groups, topk_group 1, top-3, correction bias randomized, 1 shared expert, "
               "routed_scaling_factor 2.5)"),
    dict(name="glm5_yarn", seed=2202, cls="GlmMoeDsaForCausalLM", cfg_cls="GlmMoeDsaConfig",
         text=GLM5_YARN, storage="bf16", config_form="glm_hub", glm=True, prompt_len=20,
         notes="glm_moe_dsa with yarn RoPE (factor 4, original 128, mscale 1, mscale_all_dim "
               "0.8), index_topk 10 < 28 tokens, indexer_types derived from index_topk_freq 2 / "
               "index_skip_topk_offset 2 = [full, full, shared, full], first_k_dense_replace 1, "
               "1 group top-2, norm_topk_prob false, routed_scaling_factor 1.5, 2 shared "
               "experts, rms_norm_eps 1e-6"),
    dict(name="glm5_dense", seed=2303, cls="GlmMoeDsaForCausalLM", cfg_cls="GlmMoeDsaConfig",
         text=GLM5_DENSE, storage="bf16", config_form="as_saved", glm=True, prompt_len=16,
         notes="glm_moe_dsa with index_topk 64 >= every sequence (DSA is a no-op: dense MLA), "
               "all layers full (GLM-5 default), 8 experts in 4 groups, topk_group 2, top-2, "
               "rope_theta 1e6"),
    dict(name="glm5_dsa_q4", seed=2404, cls="GlmMoeDsaForCausalLM", cfg_cls="GlmMoeDsaConfig",
         text=GLM5, storage="bf16", config_form="as_saved", glm=True, prompt_len=24,
         mlx=dict(bits=4, group_size=32, rules=GLM5_Q_RULES),
         notes="MLX (mlx-lm sanitize layout) copy of a glm5_dsa-like model: experts stacked as "
               "mlp.switch_mlp.{gate,up,down}_proj, kv_b_proj split into self_attn.embed_q "
               "[H, kv_lora, nope] and self_attn.unembed_out [H, v, kv_lora]; default 4-bit g32, "
               "overrides 8/6-bit and one module unquantized (false); router gate and norms bf16, "
               "correction bias F32"),
]
