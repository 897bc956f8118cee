"""A checkpoint's routed experts of one MoE layer in fp32, decoded from its own files (their layouts, not vLLM's),
with the activation its config asks for: the reference the CPU loader tests (tests/plugin/vllm_cpu_load.py) and the
e2e MoE-layer oracle (tests/e2e/moe_oracle.py) compute against (lk_moe.reference.moe_reference takes the dict)."""
import json
import os

import torch
from safetensors.torch import load_file

from lvllm.cli.checkpoint_info import expert_shape
from lvllm.testing.checkpoint_quant import decode_mxfp4, decode_projection
from lvllm.testing.tiny_checkpoint import BLOCK_SPARSE, MTP_UNDER_MTP, TEXT_PREFIX

DEEPSEEK_V4 = ("deepseek_v4", "deepseek_v41")  # the inference release's names: layers.<i>.ffn.experts.<e>.w1 ...


def expert_weight(t, base, quant):
    """fp32 [N, K] of one projection, decoded from the checkpoint's own tensors (file layouts; the
    dequantizers are lk_moe.reference's, checked against vLLM's and transformers' own)."""
    return decode_projection(t, base)


def dummy_reference(model_dir, arch):
    """`--load-format dummy`: the plugin fills host experts itself (lvllm.dummy_weights); every
    tensor gets the same deterministic tile, so the reference is that fill of each full shape."""
    from lvllm.dummy_weights import fill_
    cfg = text_config(model_dir)
    E, H, I = expert_shape(cfg)
    act = minimax_m3_activation(cfg) if arch == "minimax_m3" else kimi_k3_activation(cfg) if arch == "kimi_k3" else {}
    return dict(w13=fill_(torch.empty(E, 2 * I, H, dtype=torch.bfloat16)).float(),
                w2=fill_(torch.empty(E, H, I, dtype=torch.bfloat16)).float(), **act)


def minimax_m3_activation(cfg):
    """vLLM's swigluoai_uninterleave: swigluoai on [gate; up] rows, with the config's constants."""
    return dict(activation="swigluoai", interleaved=False, swiglu_alpha=cfg["swiglu_alpha"],
                swiglu_limit=cfg["swiglu_limit"])


def kimi_k3_activation(cfg):
    """Kimi-K3's SituGLU with the config's constants (vLLM's FusedMoEConfig carries them; linear beta None = 0)."""
    return dict(activation="situ", situ_beta=cfg["activation_situ_beta"],
                situ_linear_beta=cfg.get("activation_situ_linear_beta") or 0.0)


def text_config(model_dir):
    """config.json, or its text model's part (vision-language releases)."""
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    return cfg.get("text_config", cfg)


def reference_layer(model_dir, arch, quant, layer_idx, draft=False):
    """{w13 [E, 2I, H], w2 [E, H, I] (fp32), activation and its constants} of decoder layer layer_idx (draft: the
    MTP / draft layers the checkpoint carries, numbered after the target's)."""
    if quant == "dummy":
        return dummy_reference(model_dir, arch)
    t = load_file(os.path.join(model_dir, "model.safetensors"))
    cfg = text_config(model_dir)
    base = TEXT_PREFIX[arch][0] if arch in TEXT_PREFIX else "model"
    if draft and arch in MTP_UNDER_MTP:
        base = "mtp"
    prefix = f"{base}.layers.{layer_idx}.{'block_sparse_moe' if arch in BLOCK_SPARSE else 'mlp'}.experts"
    if draft and arch == "minimax_m3":  # its MTP modules' decoder layers: <model>.mtp.layers.<i>.transformer_layer
        prefix = f"{base}.mtp.layers.{layer_idx}.transformer_layer.block_sparse_moe.experts"
    act = {}
    if arch in DEEPSEEK_V4:  # the inference release's names (V4's MTP layers: mtp.<i>); clamped SwiGLU experts
        L = cfg["num_hidden_layers"]
        prefix = f"mtp.{layer_idx - L}.ffn.experts" if draft and layer_idx >= L else f"layers.{layer_idx}.ffn.experts"
        act = dict(activation="silu_clamp", swiglu_limit=cfg["swiglu_limit"])
    if arch == "minimax_m3":
        act = minimax_m3_activation(cfg)
    if arch == "kimi_k3":
        act = kimi_k3_activation(cfg)
    if arch == "gpt_oss":
        def mx(name):
            return decode_mxfp4(t[f"{prefix}.{name}_blocks"], t[f"{prefix}.{name}_scales"])
        return dict(w13=mx("gate_up_proj"), w2=mx("down_proj"), w13_bias=t[f"{prefix}.gate_up_proj_bias"].float(),
                    w2_bias=t[f"{prefix}.down_proj_bias"].float(), activation="swigluoai", interleaved=True,
                    swiglu_limit=cfg.get("swiglu_limit", 7.0))
    E = expert_shape(cfg)[0]
    names = ("w1", "w3", "w2") if arch in BLOCK_SPARSE + DEEPSEEK_V4 else ("gate_proj", "up_proj", "down_proj")
    w13 = torch.stack([torch.cat([expert_weight(t, f"{prefix}.{e}.{names[0]}.", quant),
                                  expert_weight(t, f"{prefix}.{e}.{names[1]}.", quant)]) for e in range(E)])
    w2 = torch.stack([expert_weight(t, f"{prefix}.{e}.{names[2]}.", quant) for e in range(E)])
    return dict(w13=w13, w2=w2, **act)


