"""Qwen3.8-Flash-Next's config.json (vLLM 0.33.0's Qwen4ExpForCausalLM, model_type qwen4_exp_text) for
lvllm.testing.tiny_checkpoint, as transformers' own Qwen4ExpTextConfig reads it (vLLM has no config class of its
own; 5.17 and 5.20 read the same fields): Gated-DeltaNet linear attention in three of four layers, the fourth a
gated full attention with a sparse indexer (QSA, "full_attention" in the file: 5.17 and 5.20 each map it to
their own name), hyper-connection residual streams, per-layer embedding (PLE) n-gram tables on some linear
layers, and a MoE in every layer: softmax top-k routing, renormalized, plain silu experts, one shared expert
behind a sigmoid gate; gate_proj / up_proj / down_proj names.

vLLM keeps the PLE tables in pinned host memory by default (its EngramConfig, cpu_offload=True, created for every
model that has them; `--engram-config '{"cpu_offload": false}'` puts them in VRAM) and gathers their rows from the
GPU through unified addressing, between the pieces of its breakable CUDA graphs: nothing for lvllm to move.

big: the widths vLLM's own Qwen4Exp GEMM plans are keyed by (nvidia/low_latency_gemm.py: hidden 2560, vocabulary
248320, 512 experts, shared expert 640, 24 heads of 256 with 2 KV heads, linear attention 16 / 48 heads of 128, an
indexer of 4 heads of 128, 4 hyper-connection streams of rank 320); not in vLLM's code, so transformers'
defaults or guesses: 40 layers, top-10, expert size 512, the indexer's budget 2048 and ratio 4, PLE on the first
layer (one FP8 table is ~48 GiB: 20M n-gram rows base x 2560). Config only: serve it with --load-format dummy (a big
dummy run: "ple_embedding_dtype" nvfp4 avoids vLLM's full-size fp16 temporary of the FP8 table's dummy fill).

tiny: with bf16 weights (`weights`) under the names and shapes transformers' own Qwen4ExpForCausalLM saves (the Hub
layout: one tensor per expert), which vLLM 0.33.0's loader reads and transformers' model, the fp32 oracle, loads.
"""
from __future__ import annotations

# tiny keeps the release's GDN head width (128): vLLM's GPU GDN kernel takes no other ("DSL kernel only supports
# D=128", H200 2026-12-05), and the release's indexer budget (2048 tokens = 512 blocks of 4): vLLM's top-k kernel
# takes 512, 1024 or 2048 blocks only
SHAPES = {
    "tiny": dict(H=256, L=4, nh=4, nkv=2, hd=64, E=8, K=2, I=128, shared_I=128, V=2048, lin_k=4, lin_v=8, lin_d=128,
                 idx_dim=64, budget=2048, hc_rank=32, ple_base=1000, ple_parts=4, ple_dtype=None, ctx=32768),
    "big": dict(H=2560, L=40, nh=24, nkv=2, hd=256, E=512, K=10, I=512, shared_I=640, V=248320, lin_k=16, lin_v=48,
                lin_d=128, idx_dim=128, budget=2048, hc_rank=320, ple_base=20_000_000, ple_parts=512,
                ple_dtype="float8_e4m3fn", ctx=262144),
}


def config(s: dict, vocab: int) -> dict:
    """(tiny_checkpoint sets bos / eos to the tokenizer's end-of-turn id: one int, as the PLE n-gram context needs.)"""
    L = s["L"]
    cfg = dict(architectures=["Qwen4ExpForCausalLM"], model_type="qwen4_exp_text", dtype="bfloat16",
               vocab_size=vocab, hidden_size=s["H"], num_hidden_layers=L, num_attention_heads=s["nh"],
               num_key_value_heads=s["nkv"], head_dim=s["hd"], hidden_act="silu", max_position_embeddings=s["ctx"],
               rms_norm_eps=1e-6, tie_word_embeddings=False,
               rope_parameters=dict(rope_type="default", rope_theta=10000000.0, partial_rotary_factor=0.25),
               # vLLM's GDN asserts on it and transformers' default (None) hides vLLM's own default
               output_gate_type="silu", linear_conv_kernel_dim=4, linear_key_head_dim=s["lin_d"],
               linear_value_head_dim=s["lin_d"], linear_num_key_heads=s["lin_k"], linear_num_value_heads=s["lin_v"],
               layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(L)],
               num_experts=s["E"], num_experts_per_tok=s["K"], moe_intermediate_size=s["I"],
               shared_expert_intermediate_size=s["shared_I"], norm_topk_prob=True,
               hc_count=4, hc_lowrank=s["hc_rank"],
               indexer_n_heads=4, indexer_kv_heads=1, indexer_head_dim=s["idx_dim"], indexer_budget=s["budget"],
               indexer_compress_ratio=4,
               # PLE on the first layer (1-based ids; linear-attention layers only)
               ple_layer_ids=[1], ple_embed_dim=s["H"], ple_conv_kernel_size=4, ngram_size=3, heads_per_ngram=8,
               ngram_vocab_size_base=s["ple_base"], make_ngram_vocab_size_divisible_by=128, seed=1234,
               split_ngram_parts=s["ple_parts"], mtp_num_hidden_layers=1)
    if s["ple_dtype"]:
        cfg["ple_embedding_dtype"] = s["ple_dtype"]
    return cfg


def weights(s: dict, vocab: int, w) -> None:
    """The tiny model's tensors into `w` (tiny_checkpoint's _Weights): transformers' own names, shapes and n-gram index
    buffers (lvllm.testing.hub_layout), the tiny checkpoints' values; the hyper-connection mixers as transformers
    initialises them, their norms (zero-centred) at a gain of 2, which takes the mixed streams (std ~0.46) to ~0.9."""
    import torch

    from .hub_layout import saved_tensors, tiny_values
    from .tiny_checkpoint import SPECIAL
    eos = SPECIAL.index("<|im_end|>")
    tensors = saved_tensors("Qwen4ExpForCausalLM", "Qwen4ExpTextConfig", config(s, vocab), bos_token_id=eos,
                            eos_token_id=eos)
    tiny_values(tensors, w, keep=lambda name: "hyper_connection" in name)
    for name in [n for n in w.t if n.endswith("hc_norm.weight")]:
        w.t[name] = torch.ones_like(w.t[name])


def mtp_weights(s: dict, w, n: int, target: dict) -> None:
    """n MTP layers as vLLM's Qwen4ExpMTP loads them (under mtp.; transformers' model has none to save): fc_embedding
    over the token's embedding and fc_hidden over the target's hidden streams with their input norms
    (pre_fc_norm_embedding, pre_fc_norm_hidden over all hc streams), a decoder layer of the target's sparse-attention
    kind at mtp.layers.<i> (the names and shapes of the target's last full-attention layer) and the hyper-connection
    mixer that collapses the streams (the target's mixer's names). Fresh values at the target tensors' scales: a
    matrix N(0, std of its target twin), a vector (norms, gains) as its twin."""
    import torch

    from .hub_layout import fresh_copy
    H, hc = s["H"], config(s, s["V"])["hc_count"]
    last = max(i for i, kind in enumerate(config(s, s["V"])["layer_types"]) if kind == "full_attention")
    for i in range(n):
        w.t.update(fresh_copy(target, f"model.layers.{last}.", f"mtp.layers.{i}.", w.g))
    w.t.update(fresh_copy(target, "model.hyper_connection_mixer.", "mtp.hyper_connection_mixer.", w.g))
    w.linear("mtp.fc_embedding", H, H)
    w.linear("mtp.fc_hidden", H, H)
    w.t["mtp.pre_fc_norm_embedding.weight"] = torch.zeros(H, dtype=torch.bfloat16)  # zero-centred (GemmaRMSNorm)
    w.t["mtp.pre_fc_norm_hidden.weight"] = torch.zeros(H * hc, dtype=torch.bfloat16)
