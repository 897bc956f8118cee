"""A tiny EAGLE-3 draft model for a tiny target checkpoint, in the layout EAGLE-3 drafts are released in (the
EAGLE / SpecForge training output that vLLM's `--speculative-config '{"method": "eagle3", "model": ...}'` reads,
e.g. the public Qwen3-30B-A3B drafts): one Llama decoder layer named `midlayer.*` whose attention reads the token
embedding and the draft's hidden state side by side (2 x hidden inputs), `fc` folding the target's three auxiliary
hidden states into one, a final `norm`, an `lm_head` over a reduced draft vocabulary and its maps to the target's
ids (`d2t`: draft id -> target id minus draft id; `t2d`: which target ids the draft can propose). No embedding: the
draft shares the target's, as the releases do. The weights are random; a test of greedy outputs with the drafts on
needs no acceptance, only drafts proposed and verified.

    make_eagle3_draft("/tmp/tiny-qwen3", "/tmp/tiny-qwen3-eagle3")
"""
from __future__ import annotations

import json
import os

import torch

ARCHITECTURE = "LlamaForCausalLMEagle3"  # what EAGLE-3 releases name; vLLM maps it to Eagle3LlamaForCausalLM
AUX_HIDDEN_STATES = 3  # target layers whose hidden states fc folds (vLLM's default count for EAGLE-3)
RELEASED_DRAFT_VOCAB = 32000  # the draft vocabulary of the public EAGLE-3 drafts for Qwen3 / Llama targets


def aux_layer_ids(layers: int) -> list:
    """The target layers whose outputs fc folds (vLLM counts 0 as the embedding, i as layer i - 1's output): vLLM's
    default for a model of `layers` layers, (2, L // 2, L - 3), where those are three distinct layers; a tiny target
    (4 layers: 2, 2, 1) would hand fc two states for three, so it gets 1, L // 2, L - 1."""
    if layers < 4:
        raise ValueError(f"an EAGLE-3 draft reads three distinct target layers: the target has {layers}")
    ids = sorted({2, layers // 2, layers - 3})
    return ids if len(ids) == AUX_HIDDEN_STATES else sorted({1, layers // 2, layers - 1})


def draft_config(target: dict, draft_vocab: int) -> dict:
    """The draft's config.json from the target's: its attention shape, vocabulary, norms and the target layers it
    reads (eagle_aux_hidden_state_layer_ids, where vLLM's model runners look first)."""
    needed = ("hidden_size", "num_attention_heads", "vocab_size", "num_hidden_layers")
    missing = [k for k in needed if k not in target]
    if missing:
        raise ValueError(f"the target's config lacks {', '.join(missing)}: not a decoder-only text model")
    H, nh, V = target["hidden_size"], target["num_attention_heads"], target["vocab_size"]
    if not 0 < draft_vocab <= V:
        raise ValueError(f"draft_vocab must be in 1..{V} (the target's vocabulary), got {draft_vocab}")
    return dict(architectures=[ARCHITECTURE], model_type="llama", hidden_size=H, num_hidden_layers=1,
                num_attention_heads=nh, num_key_value_heads=target.get("num_key_value_heads", nh),
                head_dim=target.get("head_dim", H // nh), intermediate_size=2 * H, hidden_act="silu",
                vocab_size=V, draft_vocab_size=draft_vocab, target_hidden_size=H,
                rms_norm_eps=target.get("rms_norm_eps", 1e-6), rope_theta=target.get("rope_theta", 10000.0),
                max_position_embeddings=target.get("max_position_embeddings", 4096), attention_bias=False,
                tie_word_embeddings=False, torch_dtype="bfloat16", bos_token_id=target.get("bos_token_id", 0),
                eos_token_id=target.get("eos_token_id", 0),
                eagle_aux_hidden_state_layer_ids=aux_layer_ids(target["num_hidden_layers"]))


def draft_tensors(cfg: dict, seed: int = 0) -> dict:
    """The draft's weights by their release names: Gaussian with 1 / sqrt(inputs) so activations stay O(1), norms
    at 1, and a random draft vocabulary (sorted target ids) with its d2t / t2d maps."""
    g = torch.Generator().manual_seed(seed)
    H, I, V, Vd = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["draft_vocab_size"]
    q, kv = cfg["num_attention_heads"] * cfg["head_dim"], cfg["num_key_value_heads"] * cfg["head_dim"]

    def w(n, k):
        return (torch.randn(n, k, generator=g) / k ** 0.5).to(torch.bfloat16)

    ones = torch.ones(H, dtype=torch.bfloat16)
    ids = torch.sort(torch.randperm(V, generator=g)[:Vd]).values
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[ids] = True
    return {
        "midlayer.input_layernorm.weight": ones.clone(), "midlayer.hidden_norm.weight": ones.clone(),
        "midlayer.post_attention_layernorm.weight": ones.clone(),
        "midlayer.self_attn.q_proj.weight": w(q, 2 * H), "midlayer.self_attn.k_proj.weight": w(kv, 2 * H),
        "midlayer.self_attn.v_proj.weight": w(kv, 2 * H), "midlayer.self_attn.o_proj.weight": w(H, q),
        "midlayer.mlp.gate_proj.weight": w(I, H), "midlayer.mlp.up_proj.weight": w(I, H),
        "midlayer.mlp.down_proj.weight": w(H, I),
        "fc.weight": w(H, AUX_HIDDEN_STATES * H), "norm.weight": ones.clone(), "lm_head.weight": w(Vd, H),
        "d2t": (ids - torch.arange(Vd)).to(torch.int64), "t2d": t2d,
    }


def make_eagle3_draft(target_dir: str, out: str, seed: int = 0, draft_vocab: int = 0) -> str:
    """Write the draft for the checkpoint at target_dir into `out` (config.json, model.safetensors); draft_vocab:
    the draft's vocabulary (default half the target's, at most the 32,000 the released drafts use; smaller than
    the target's either way, so the d2t map is exercised). Returns `out`."""
    from safetensors.torch import save_file
    with open(os.path.join(target_dir, "config.json")) as f:
        target = json.load(f)
    target = target.get("text_config", target)
    cfg = draft_config(target, draft_vocab or max(1, min(RELEASED_DRAFT_VOCAB, target.get("vocab_size", 0) // 2)))
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    save_file(draft_tensors(cfg, seed), os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    return out
