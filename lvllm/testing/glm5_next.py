"""GLM-5.3's config.json ("GLM-5-next", Glm5NextForCausalLM) for lvllm.testing.tiny_checkpoint, as transformers'
own Glm5NextTextConfig (the class vLLM 0.33.0 uses) reads it: hybrid attention (Kimi Delta Attention layers, every
fourth an indexed one: NoPE sparse MLA with a pooled DSA indexer), mHC residual streams, dense first layers, then
MoE layers with grouped sigmoid routing and a selection bias (noaux_tc), a shared expert, silu experts clamped at
swiglu_limit (the engine's silu_clamp), gate_proj/up_proj/down_proj names. The kernels' fixed widths are kept (MLA's
512-wide latent, 256-wide NoPE heads, 128-wide indexer heads); the config class wants as many KV heads as heads.

big: transformers' Glm5NextTextConfig defaults (45 layers, 288 experts, top-8, hidden 4096, expert size 2048): the
released shape, config only (serve it with --load-format dummy). tiny: with bf16 weights (`weights`) under the names and
shapes transformers' own Glm5NextTextModel saves (the Hub layout: one tensor per expert; its KDA projections q/k/v/b,
f_a/f_b, g_a/g_b with their short convolutions, MLA's q_a/q_b/kv_a/kv_b without RoPE rows, the indexer's wq_b / wk /
weights_proj and its pooled-key compression, the mHC mixers hc_attn_* / hc_ffn_*) under model., and an lm_head.
"""
from __future__ import annotations

SHAPES = {
    "tiny": dict(H=256, L=4, dense=1, nh=4, E=8, K=2, I=128, dense_I=512, V=2048, q_lora=256, idx_heads=4,
                 lin_heads=4, ctx=32768),
    "big": dict(H=4096, L=45, dense=3, nh=64, E=288, K=8, I=2048, dense_I=12288, V=154880, q_lora=1536, idx_heads=32,
                lin_heads=64, ctx=1048576),
}


def config(s: dict, vocab: int) -> dict:
    L, dense = s["L"], s["dense"]
    return dict(architectures=["Glm5NextForCausalLM"], model_type="glm5_next_text", torch_dtype="bfloat16",
                vocab_size=vocab, hidden_size=s["H"], intermediate_size=s["dense_I"], moe_intermediate_size=s["I"],
                num_hidden_layers=L, num_attention_heads=s["nh"], num_key_value_heads=s["nh"],
                n_routed_experts=s["E"], n_shared_experts=1, num_experts_per_tok=s["K"], n_group=1, topk_group=1,
                norm_topk_prob=True, routed_scaling_factor=2.5, scoring_func="sigmoid", topk_method="noaux_tc",
                hidden_act="silu", swiglu_limit=10.0,
                mlp_layer_types=["dense"] * dense + ["sparse"] * (L - dense),
                # "full_attention" for the MLA (DSA) layers, as released: every transformers vLLM 0.33.0 accepts it
                # (5.20 renames it "indexed_attention", which 5.17's validator rejects)
                layer_types=["full_attention" if i % 4 == 3 else "linear_attention" for i in range(L)],
                kv_lora_rank=512, q_lora_rank=s["q_lora"], qk_rope_head_dim=0, qk_nope_head_dim=256, v_head_dim=256,
                mla_use_nope=True, index_topk=2048, index_kpool=16, index_kpool_always_select_tail=True,
                index_head_dim=128, index_n_heads=s["idx_heads"], indexer_rope_interleave=False,
                linear_head_dim=128, linear_num_heads=s["lin_heads"], linear_conv_kernel_dim=4,
                linear_lower_bound=-5.0, mhc=True, hc_mult=4, hc_eps=1e-6, hc_sinkhorn_iters=20,
                num_nextn_predict_layers=1, max_position_embeddings=s["ctx"], rms_norm_eps=1e-5,
                # pad: the tokenizer's <|endoftext|> (transformers' default is the release vocabulary's: past a tiny one)
                tie_word_embeddings=False, pad_token_id=0)


def weights(s: dict, vocab: int, w) -> None:
    """The tiny model's tensors into `w` (tiny_checkpoint's _Weights): transformers' own text model's names and shapes
    (lvllm.testing.hub_layout) under model., an lm_head, the tiny checkpoints' values; the mHC mixers (hc_*) and the
    indexer's pooled-key compression as transformers initialises them."""
    import torch

    from .hub_layout import saved_tensors, tiny_values
    from .tiny_checkpoint import SPECIAL
    eos = SPECIAL.index("<|im_end|>")
    text = saved_tensors("Glm5NextTextModel", "Glm5NextTextConfig", config(s, vocab), conversion_of="glm5_next",
                         bos_token_id=eos, eos_token_id=eos)
    tensors = {f"model.{k}": t for k, t in text.items()}
    tensors["lm_head.weight"] = torch.empty(vocab, s["H"])
    tiny_values(tensors, w, keep=lambda name: ".hc_" in name or "index_kpool_compress" in name)


def mtp_weights(s: dict, w, n: int, target: dict) -> None:
    """n MTP layers as vLLM's Glm5NextMTP loads them (DeepSeek-V3's layout, after the decoder layers:
    model.layers.<L + i>): enorm / hnorm, eh_proj over [embedding; hidden], shared_head.norm (the head is the
    target's lm_head), and a decoder layer of the target's sparse MLA kind with its MoE, without mHC streams (vLLM
    builds MTP layers without them): the names and shapes of the target's last MLA layer but its hc_* mixers, fresh
    values at the target tensors' scales."""
    import torch

    from .hub_layout import fresh_copy
    H, L = s["H"], s["L"]
    last = max(i for i, kind in enumerate(config(s, s["V"])["layer_types"]) if kind == "full_attention")
    for i in range(n):
        p = f"model.layers.{L + i}"
        w.t.update(fresh_copy(target, f"model.layers.{last}.", f"{p}.", w.g, skip=lambda name: ".hc_" in name))
        for norm in ("enorm", "hnorm", "shared_head.norm"):
            w.t[f"{p}.{norm}.weight"] = torch.ones(H, dtype=torch.bfloat16)
        w.linear(f"{p}.eh_proj", H, 2 * H)
