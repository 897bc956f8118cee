#!/usr/bin/env python3
"""Write a small checkpoint of a real MoE architecture: config.json that vLLM 0.33.0 loads as it
is, safetensors with random weights under the names the Hub checkpoints of that family use, and
a small byte-level BPE tokenizer with a chat template (so `vllm serve` works with text).

    python tools/make_tiny_checkpoint.py --arch qwen3_moe --out /tmp/tiny-qwen3
    python tools/make_tiny_checkpoint.py --arch qwen3_moe --size big --out /tmp/q30b   # config only:
        # Qwen3-30B-A3B's shape, for `vllm serve ... --load-format dummy` benchmarks

Architectures: qwen3_moe, deepseek_v3, glm4_moe, mixtral (bf16; --quant fp8, w4a16, nvfp4, fp8_channel
or int8_channel for the quantized layouts) and gpt_oss (MXFP4 experts with biases, as released; the
layout was checked against transformers' own MXFP4 dequantization).

Weights are N(0, 1/fan_in) (unit-variance activations through every projection, so the routed
experts matter to the output), norms 1, router bias small; a fixed --seed gives the same files.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Dict

import torch

ARCHS = ("qwen3_moe", "deepseek_v3", "glm4_moe", "mixtral", "gpt_oss")

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

# tiny: CI-fast; big: the real model's shape (config only, for --load-format dummy)
SHAPES = {
    "qwen3_moe": {
        "tiny": dict(H=512, L=4, nh=8, nkv=4, hd=64, E=16, K=4, I=256, dense_I=1024, V=2048),
        "big": dict(H=2048, L=48, nh=32, nkv=4, hd=128, E=128, K=8, I=768, dense_I=6144, V=151936, ctx=40960),
    },
    "deepseek_v3": {
        "tiny": dict(H=512, L=4, nh=16, E=16, K=4, I=256, dense_I=1024, V=2048, q_lora=256, kv_lora=512,
                     nope=128, rope=64, v=128, groups=4, topk_groups=2, shared=1, dense=1),
        "big": dict(H=7168, L=61, nh=128, E=256, K=8, I=2048, dense_I=18432, V=129280, q_lora=1536,
                    kv_lora=512, nope=128, rope=64, v=128, groups=8, topk_groups=4, shared=1, dense=3, ctx=163840),
    },
    "glm4_moe": {
        "tiny": dict(H=512, L=4, nh=8, nkv=4, hd=64, E=16, K=4, I=256, dense_I=1024, V=2048, shared=1, dense=1),
        "big": dict(H=5120, L=92, nh=96, nkv=8, hd=128, E=160, K=8, I=1536, dense_I=12288, V=151552,
                    shared=1, dense=3, ctx=131072),
    },
    "gpt_oss": {  # MXFP4 experts always (its checkpoints ship them so)
        "tiny": dict(H=512, L=4, nh=8, nkv=4, hd=64, E=16, K=4, I=256, V=2048),
        "big": dict(H=2880, L=36, nh=64, nkv=8, hd=64, E=128, K=4, I=2880, V=201088, ctx=131072),
    },
    "mixtral": {
        "tiny": dict(H=512, L=4, nh=8, nkv=4, hd=64, E=8, K=2, I=512, V=2048),
        "big": dict(H=6144, L=56, nh=48, nkv=8, hd=128, E=8, K=2, I=16384, V=32768, ctx=65536),
    },
}


def _config(arch: str, s: dict, vocab: int) -> dict:
    common = dict(vocab_size=vocab, hidden_size=s["H"], num_hidden_layers=s["L"],
                  num_attention_heads=s["nh"], hidden_act="silu", max_position_embeddings=s.get("ctx", 4096),
                  rms_norm_eps=1e-6, tie_word_embeddings=False, torch_dtype="bfloat16",
                  bos_token_id=0, eos_token_id=0, initializer_range=0.02)
    if arch == "qwen3_moe":
        return dict(common, architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe",
                    num_key_value_heads=s["nkv"], head_dim=s["hd"], intermediate_size=s["dense_I"],
                    num_experts=s["E"], num_experts_per_tok=s["K"], moe_intermediate_size=s["I"],
                    norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], attention_bias=False,
                    rope_theta=1000000.0, use_sliding_window=False)
    if arch == "deepseek_v3":
        return dict(common, architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3",
                    num_key_value_heads=s["nh"], intermediate_size=s["dense_I"], moe_intermediate_size=s["I"],
                    n_routed_experts=s["E"], n_shared_experts=s["shared"], num_experts_per_tok=s["K"],
                    routed_scaling_factor=2.5, n_group=s["groups"], topk_group=s["topk_groups"],
                    topk_method="noaux_tc", scoring_func="sigmoid", norm_topk_prob=True, moe_layer_freq=1,
                    first_k_dense_replace=s["dense"], q_lora_rank=s["q_lora"], kv_lora_rank=s["kv_lora"],
                    qk_nope_head_dim=s["nope"], qk_rope_head_dim=s["rope"], v_head_dim=s["v"],
                    rope_theta=10000.0, rope_scaling=None, attention_bias=False, num_nextn_predict_layers=0)
    if arch == "glm4_moe":
        return dict(common, architectures=["Glm4MoeForCausalLM"], model_type="glm4_moe",
                    num_key_value_heads=s["nkv"], head_dim=s["hd"], intermediate_size=s["dense_I"],
                    moe_intermediate_size=s["I"], n_routed_experts=s["E"], n_shared_experts=s["shared"],
                    num_experts_per_tok=s["K"], routed_scaling_factor=2.5, n_group=1, topk_group=1,
                    first_k_dense_replace=s["dense"], norm_topk_prob=True, partial_rotary_factor=0.5,
                    attention_bias=True, use_qk_norm=False, rope_theta=1000000.0, num_nextn_predict_layers=0)
    if arch == "mixtral":
        return dict(common, architectures=["MixtralForCausalLM"], model_type="mixtral",
                    num_key_value_heads=s["nkv"], head_dim=s["hd"], intermediate_size=s["I"],
                    num_local_experts=s["E"], num_experts_per_tok=s["K"], rope_theta=1000000.0,
                    sliding_window=None, router_aux_loss_coef=0.02)
    if arch == "gpt_oss":
        return dict(common, architectures=["GptOssForCausalLM"], model_type="gpt_oss",
                    num_key_value_heads=s["nkv"], head_dim=s["hd"], intermediate_size=s["I"],
                    num_local_experts=s["E"], num_experts_per_tok=s["K"], experts_per_token=s["K"],
                    sliding_window=128, layer_types=["sliding_attention", "full_attention"] * (s["L"] // 2),
                    rope_theta=150000.0, rope_scaling={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                                                       "beta_slow": 1.0, "truncate": False,
                                                       "original_max_position_embeddings": 4096},
                    swiglu_limit=7.0, attention_bias=True, rms_norm_eps=1e-5,
                    quantization_config={"quant_method": "mxfp4",
                                         "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                                    "model.embed_tokens", "lm_head"]})
    raise ValueError(f"unknown architecture {arch!r}; choose from {', '.join(ARCHS)}")


_E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def quantize_mxfp4(w: torch.Tensor):
    """fp32 [..., N, K] -> (blocks uint8 [..., N, K/32, 16], scales uint8 [..., N, K/32]): per 32 inputs
    an e8m0 scale 2^(s-127) and e2m1 codes (sign bit 3, magnitude index bits 0-2), two per byte,
    element 2i in the low nibble (the OCP MX layout of gpt-oss checkpoints)."""
    *lead, N, K = w.shape
    g = w.reshape(*lead, N, K // 32, 32)
    amax = g.abs().amax(dim=-1).clamp(min=2.0 ** -100)
    e = torch.ceil(torch.log2(amax / 6.0)).clamp(-127, 127)
    x = g / torch.exp2(e)[..., None]
    idx = (x.abs()[..., None] - _E2M1).abs().argmin(dim=-1)
    codes = (idx | ((x < 0) & (idx > 0)).to(torch.int64) << 3).to(torch.uint8)
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return packed.contiguous(), (e + 127).to(torch.uint8).contiguous()


def decode_mxfp4(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The inverse of quantize_mxfp4: blocks [..., N, K/32, 16] + scales [..., N, K/32] -> fp32
    [..., N, K] (exact). Written from the same convention; the tests check it against
    transformers' own MXFP4 dequantization."""
    codes = torch.stack([blocks & 15, blocks >> 4], dim=-1).long()
    mags = _E2M1[codes & 7] * torch.where(codes >= 8, -1.0, 1.0)
    vals = mags.reshape(*blocks.shape[:-1], 32) * torch.exp2(scales.float() - 127)[..., None]
    return vals.reshape(*blocks.shape[:-2], blocks.shape[-2] * 32)


def _gpt_oss_weights(s: dict, vocab: int, w) -> None:
    H, E, I = s["H"], s["E"], s["I"]
    for i in range(s["L"]):
        p = f"model.layers.{i}"
        w.norm(f"{p}.input_layernorm", H)
        w.norm(f"{p}.post_attention_layernorm", H)
        a = f"{p}.self_attn"
        w.linear(f"{a}.q_proj", s["nh"] * s["hd"], H, bias=True)
        w.linear(f"{a}.k_proj", s["nkv"] * s["hd"], H, bias=True)
        w.linear(f"{a}.v_proj", s["nkv"] * s["hd"], H, bias=True)
        w.linear(f"{a}.o_proj", H, s["nh"] * s["hd"], bias=True)
        w.t[f"{a}.sinks"] = torch.randn(s["nh"], generator=w.g).to(torch.bfloat16)
        w.linear(f"{p}.mlp.router", E, H, bias=True)
        m = f"{p}.mlp.experts"
        gate_up = torch.randn(E, 2 * I, H, generator=w.g) / H ** 0.5  # rows interleaved: gate_j, up_j
        down = torch.randn(E, H, I, generator=w.g) / I ** 0.5
        for name, t in (("gate_up_proj", gate_up), ("down_proj", down)):
            blocks, scales = quantize_mxfp4(t)
            w.t[f"{m}.{name}_blocks"] = blocks
            w.t[f"{m}.{name}_scales"] = scales
            w.t[f"{m}.{name}_bias"] = (0.1 * torch.randn(E, t.shape[1], generator=w.g)).to(torch.bfloat16)


class _Weights:
    def __init__(self, seed: int):
        self.g = torch.Generator().manual_seed(seed)
        self.t: Dict[str, torch.Tensor] = {}

    def linear(self, name: str, out_f: int, in_f: int, bias: bool = False, gain: float = 1.0) -> None:
        w = torch.randn(out_f, in_f, generator=self.g) * (gain / math.sqrt(in_f))
        self.t[f"{name}.weight"] = w.to(torch.bfloat16)
        if bias:
            self.t[f"{name}.bias"] = (0.1 * torch.randn(out_f, generator=self.g)).to(torch.bfloat16)

    def norm(self, name: str, n: int) -> None:
        self.t[f"{name}.weight"] = torch.ones(n, dtype=torch.bfloat16)

    def mlp(self, prefix: str, H: int, I: int, names=("gate_proj", "up_proj", "down_proj")) -> None:
        self.linear(f"{prefix}.{names[0]}", I, H)
        self.linear(f"{prefix}.{names[1]}", I, H)
        self.linear(f"{prefix}.{names[2]}", H, I)


def _weights(arch: str, s: dict, vocab: int, seed: int) -> Dict[str, torch.Tensor]:
    w = _Weights(seed)
    H = s["H"]
    w.t["model.embed_tokens.weight"] = torch.randn(vocab, H, generator=w.g).to(torch.bfloat16)
    # Logits of std ~3: fewer near-ties between the top tokens than unit-std logits would give.
    w.linear("lm_head", vocab, H, gain=3.0)
    w.norm("model.norm", H)
    if arch == "gpt_oss":
        _gpt_oss_weights(s, vocab, w)
        return w.t
    for i in range(s["L"]):
        p = f"model.layers.{i}"
        w.norm(f"{p}.input_layernorm", H)
        w.norm(f"{p}.post_attention_layernorm", H)
        a = f"{p}.self_attn"
        if arch == "deepseek_v3":
            w.linear(f"{a}.q_a_proj", s["q_lora"], H)
            w.norm(f"{a}.q_a_layernorm", s["q_lora"])
            w.linear(f"{a}.q_b_proj", s["nh"] * (s["nope"] + s["rope"]), s["q_lora"])
            w.linear(f"{a}.kv_a_proj_with_mqa", s["kv_lora"] + s["rope"], H)
            w.norm(f"{a}.kv_a_layernorm", s["kv_lora"])
            w.linear(f"{a}.kv_b_proj", s["nh"] * (s["nope"] + s["v"]), s["kv_lora"])
            w.linear(f"{a}.o_proj", H, s["nh"] * s["v"])
        else:
            bias = arch == "glm4_moe"
            w.linear(f"{a}.q_proj", s["nh"] * s["hd"], H, bias)
            w.linear(f"{a}.k_proj", s["nkv"] * s["hd"], H, bias)
            w.linear(f"{a}.v_proj", s["nkv"] * s["hd"], H, bias)
            w.linear(f"{a}.o_proj", H, s["nh"] * s["hd"])
            if arch == "qwen3_moe":
                w.norm(f"{a}.q_norm", s["hd"])
                w.norm(f"{a}.k_norm", s["hd"])
        if arch in ("deepseek_v3", "glm4_moe") and i < s["dense"]:
            w.mlp(f"{p}.mlp", H, s["dense_I"])
            continue
        moe = f"{p}.block_sparse_moe" if arch == "mixtral" else f"{p}.mlp"
        w.linear(f"{moe}.gate", s["E"], H)
        if arch in ("deepseek_v3", "glm4_moe"):
            # Real checkpoints store the selection bias in fp32.
            w.t[f"{moe}.gate.e_score_correction_bias"] = 0.01 * torch.randn(s["E"], generator=w.g)
            w.mlp(f"{moe}.shared_experts", H, s["I"] * s["shared"])
        names = ("w1", "w3", "w2") if arch == "mixtral" else ("gate_proj", "up_proj", "down_proj")
        for e in range(s["E"]):
            w.mlp(f"{moe}.experts.{e}", H, s["I"], names)
    return w.t


def _corpus():
    words = ("the of and to in is was for on that with as by at from his her an were are which this be "
             "mixture experts layer token model memory bandwidth host device prefill decode cache route "
             "alpha beta gamma delta zero one two three four five six seven eight nine ten").split()
    g = torch.Generator().manual_seed(7)
    for _ in range(2000):
        idx = torch.randint(len(words), (12,), generator=g).tolist()
        yield " ".join(words[i] for i in idx) + ". 0123456789 ,;:!?"


def write_tokenizer(out: str, vocab_size: int) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus(), trainer)
    tok.save(os.path.join(out, "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": "<|im_end|>",
           "pad_token": "<|endoftext|>", "unk_token": None, "model_max_length": 4096,
           "chat_template": CHAT_TEMPLATE, "clean_up_tokenization_spaces": False}
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    return tok.get_vocab_size()


QUANTS = ("bf16", "fp8", "w4a16", "nvfp4", "fp8_channel", "int8_channel")


def _is_router(name: str) -> bool:
    return name.endswith((".mlp.gate.weight", ".block_sparse_moe.gate.weight"))


def _quantized_projection(name: str, w: torch.Tensor, experts_only: bool) -> bool:
    """Whether a quantized checkpoint holds this tensor quantized: projection weights, never the
    router, embeddings or lm_head (and with experts_only the routed experts alone)."""
    if not name.endswith(".weight") or w.dim() != 2 or _is_router(name) or name.startswith(("lm_head", "model.embed")):
        return False
    return not experts_only or ".experts." in name


def quantize_fp8_block(tensors: Dict[str, torch.Tensor], block: int = 128,
                       experts_only: bool = False) -> Dict[str, torch.Tensor]:
    """The layout of DeepSeek-V3 / Qwen3-FP8 checkpoints: every projection weight as float8_e4m3fn
    with `weight_scale_inv` fp32 [ceil(N/128), ceil(K/128)] (dequantized = code * scale); router,
    embeddings, norms, biases and lm_head stay as they are."""
    out = {}
    for name, w in tensors.items():
        if not _quantized_projection(name, w, experts_only):
            out[name] = w
            continue
        N, K = w.shape
        nb, kb = -(-N // block), -(-K // block)
        padded = torch.zeros(nb * block, kb * block)
        padded[:N, :K] = w.float()
        tiles = padded.reshape(nb, block, kb, block)
        scale = tiles.abs().amax(dim=(1, 3)).clamp(min=1e-12) / 448.0
        q = (tiles / scale[:, None, :, None]).clamp(-448, 448).to(torch.float8_e4m3fn)
        out[name] = q.reshape(nb * block, kb * block)[:N, :K].contiguous()
        out[name[:-len("weight")] + "weight_scale_inv"] = scale.float().contiguous()
    return out


def _fp8_config(tensors: Dict[str, torch.Tensor]) -> dict:
    # Everything left in bf16 (router, lm_head, and with experts_only every other projection).
    keep = sorted(n[:-len(".weight")] for n, t in tensors.items()
                  if n.endswith(".weight") and t.dim() == 2 and t.dtype != torch.float8_e4m3fn
                  and not n.startswith("model.embed"))
    return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
            "weight_block_size": [128, 128], "modules_to_not_convert": keep}


def _pack_int4_along_k(u: torch.Tensor) -> torch.Tensor:
    """Unsigned 4-bit codes [N, K] -> int32 [N, K/8]: input 8w+i in bits 4i..4i+3 of word w
    (compressed-tensors pack-quantized)."""
    u = u.to(torch.int64)
    words = torch.zeros(u.shape[0], u.shape[1] // 8, dtype=torch.int64)
    for i in range(8):
        words |= u[:, i::8] << (4 * i)
    return torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)


def quantize_w4a16(tensors: Dict[str, torch.Tensor], group: int = 32) -> Dict[str, torch.Tensor]:
    """Routed experts as compressed-tensors W4A16 (Kimi-K2-Thinking's layout): per expert projection
    `weight_packed` int32 [N, K/8] (codes q+8), `weight_scale` bf16 [N, K/group], `weight_shape`
    [2]; symmetric, dequantized = q * scale. Everything else stays bf16."""
    out = {}
    for name, w in tensors.items():
        if ".experts." not in name or not name.endswith(".weight") or w.dim() != 2:
            out[name] = w
            continue
        N, K = w.shape
        g = w.float().reshape(N, K // group, group)
        scale = (g.abs().amax(dim=2) / 7.0).clamp(min=1e-8).to(torch.bfloat16)
        q = torch.round(g / scale.float()[..., None]).clamp(-8, 7).reshape(N, K)
        base = name[:-len("weight")]
        out[base + "weight_packed"] = _pack_int4_along_k((q + 8).to(torch.int64))
        out[base + "weight_scale"] = scale.contiguous()
        out[base + "weight_shape"] = torch.tensor([N, K], dtype=torch.int64)
    return out


def _w4a16_config(tensors: Dict[str, torch.Tensor], group: int = 32) -> dict:
    # Every Linear but the routed experts stays bf16: list those modules by name.
    ignore = sorted({n[:-len(".weight")] for n, t in tensors.items()
                     if n.endswith(".weight") and t.dim() == 2 and ".experts." not in n
                     and not n.startswith("model.embed")})
    scheme = {"targets": ["Linear"], "input_activations": None, "output_activations": None,
              "format": "pack-quantized",
              "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
                          "group_size": group, "dynamic": False, "actorder": None, "observer": "minmax"}}
    return {"quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
            "config_groups": {"group_0": scheme}, "ignore": ignore, "kv_cache_scheme": None}


# ModelOpt NVFP4 (what `modelopt.torch.export` writes, e.g. nvidia/Qwen3-30B-A3B-FP4), per quantized
# Linear `name`: name.weight uint8 [N, K/2] (two e2m1 codes per byte, element 2i in the low nibble),
# name.weight_scale float8_e4m3fn [N, K/16] (per 16 inputs), name.weight_scale_2 fp32 scalar (the
# per-tensor global scale amax / (6 * 448), not its reciprocal), name.input_scale fp32 scalar (the
# activation scale W4A4 kernels use). weight = e2m1(code) * weight_scale * weight_scale_2. vLLM 0.33
# reads them under these names (ModelOptNvFp4LinearMethod / ModelOptNvFp4FusedMoE, modelopt.py).
NVFP4_GROUP = 16
_E2M1_MAX, _E4M3_MAX = 6.0, 448.0


def quantize_nvfp4_tensor(w: torch.Tensor):
    """fp32 [N, K] -> (uint8 codes [N, K/2], float8_e4m3fn block scales [N, K/16], fp32 global scale []),
    ModelOpt's recipe: global = amax / (6 * 448), block scale = fp8(block amax / 6 / global), code =
    nearest e2m1 of w / (block scale * global)."""
    N, K = w.shape
    w = w.float()
    gs = (w.abs().amax() / (_E2M1_MAX * _E4M3_MAX)).clamp(min=2.0 ** -100)
    g = w.reshape(N, K // NVFP4_GROUP, NVFP4_GROUP)
    sf = (g.abs().amax(dim=-1) / _E2M1_MAX / gs).clamp(max=_E4M3_MAX).to(torch.float8_e4m3fn)
    denom = (sf.float() * gs).clamp(min=2.0 ** -126)[..., None]
    x = g / denom
    idx = (x.abs()[..., None] - _E2M1).abs().argmin(dim=-1)
    codes = (idx | ((x < 0) & (idx > 0)).to(torch.int64) << 3).to(torch.uint8).reshape(N, K)
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous(), sf.contiguous(), gs.reshape(()).float()


def decode_nvfp4(weight: torch.Tensor, weight_scale: torch.Tensor, weight_scale_2) -> torch.Tensor:
    """The checkpoint's tensors of one Linear -> fp32 [N, K]: the exact product code * block scale *
    global scale rounded to fp32 once (written from the convention above, independently of lk_moe)."""
    codes = torch.stack([weight & 15, weight >> 4], dim=-1).long().reshape(weight.shape[0], -1)
    mags = _E2M1.double()[codes & 7] * torch.where(codes >= 8, -1.0, 1.0).double()
    s = weight_scale.double().repeat_interleave(NVFP4_GROUP, dim=1)
    return (mags * s * torch.as_tensor(weight_scale_2).double()).float()


def quantize_nvfp4(tensors: Dict[str, torch.Tensor], experts_only: bool = False,
                   seed: int = 0) -> Dict[str, torch.Tensor]:
    """Every projection (experts_only: routed experts only) as ModelOpt NVFP4; router, embeddings,
    norms, biases and lm_head stay as they are (ModelOpt excludes them)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, w in tensors.items():
        if not _quantized_projection(name, w, experts_only):
            out[name] = w
            continue
        base = name[:-len("weight")]
        q, sf, gs = quantize_nvfp4_tensor(w)
        out[name] = q
        out[base + "weight_scale"] = sf
        out[base + "weight_scale_2"] = gs
        out[base + "input_scale"] = (torch.rand((), generator=g) * 2e-3 + 1e-3).float()  # ~amax(x) / 2688
    return out


def _nvfp4_config(tensors: Dict[str, torch.Tensor]) -> dict:
    # config.json's quantization_config as ModelOpt exports it (vLLM reads quant_algo, group_size, ignore).
    ignore = sorted(n[:-len(".weight")] for n, t in tensors.items()
                    if n.endswith(".weight") and t.dim() == 2 and t.dtype != torch.uint8 and not n.startswith("model.embed"))
    group = {"num_bits": 4, "type": "float", "group_size": NVFP4_GROUP, "dynamic": False}
    return {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": NVFP4_GROUP, "kv_cache_scheme": None,
            "ignore": ignore, "producer": {"name": "modelopt", "version": "0.37.0"},
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": dict(group),
                                          "input_activations": dict(group)}}}


def _nvfp4_hf_quant_config(qc: dict) -> dict:
    # The older file ModelOpt writes next to it (hf_quant_config.json), the same facts.
    return {"producer": qc["producer"], "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None,
                                                         "group_size": qc["group_size"], "exclude_modules": qc["ignore"]}}


# compressed-tensors W8A8 per channel (what llm-compressor's FP8_DYNAMIC and INT8 W8A8 presets write,
# e.g. RedHatAI/Qwen3-30B-A3B-FP8-dynamic, *-quantized.w8a8), per quantized Linear `name`: name.weight
# float8_e4m3fn or int8 [N, K], name.weight_scale [N, 1] in the model's dtype (compressed-tensors gives a
# scale the dtype of the weight it observed: bf16 here); symmetric, no zero point, weight = code *
# scale. Activations are quantized per token at run time: no input scales in the file. vLLM 0.33 reads
# them as CompressedTensorsW8A8Fp8MoEMethod / CompressedTensorsW8A8Int8MoEMethod for the experts.
W8A8_CHANNEL = {  # quant -> (code dtype, largest code, compressed-tensors type and format)
    "fp8_channel": (torch.float8_e4m3fn, 448.0, "float", "float-quantized"),
    "int8_channel": (torch.int8, 127.0, "int", "int-quantized"),
}


def quantize_w8a8_channel_tensor(w: torch.Tensor, quant: str):
    """fp32 [N, K] -> (codes [N, K], bf16 scales [N, 1]): scale = row amax / largest code (rounded to
    bf16 first, so the codes are computed against the scale the file holds); fp8 codes are the nearest
    e4m3 value, int8 codes round half to even."""
    dtype, qmax, _, _ = W8A8_CHANNEL[quant]
    w = w.float()
    scale = (w.abs().amax(dim=1, keepdim=True) / qmax).clamp(min=1e-12).to(torch.bfloat16)
    x = (w / scale.float()).clamp(-qmax, qmax)
    codes = x.to(dtype) if dtype.is_floating_point else torch.round(x).to(dtype)
    return codes.contiguous(), scale.contiguous()


def quantize_w8a8_channel(tensors: Dict[str, torch.Tensor], quant: str,
                          experts_only: bool = False) -> Dict[str, torch.Tensor]:
    """Every projection (experts_only: the routed experts only) as compressed-tensors W8A8 per channel
    (quant "fp8_channel" or "int8_channel"); router, embeddings, norms, biases and lm_head stay as they are."""
    out = {}
    for name, w in tensors.items():
        if not _quantized_projection(name, w, experts_only):
            out[name] = w
            continue
        out[name], out[name[:-len("weight")] + "weight_scale"] = quantize_w8a8_channel_tensor(w, quant)
    return out


def _w8a8_channel_config(tensors: Dict[str, torch.Tensor], quant: str) -> dict:
    # As llm-compressor serializes the preset: every Linear targeted, the ones left bf16 (router,
    # lm_head, with experts_only all but the routed experts) listed in "ignore".
    dtype, _, typ, fmt = W8A8_CHANNEL[quant]
    ignore = sorted(n[:-len(".weight")] for n, t in tensors.items()
                    if n.endswith(".weight") and t.dim() == 2 and t.dtype != dtype and not n.startswith("model.embed"))

    def args(strategy: str, dynamic: bool, observer) -> dict:
        return {"num_bits": 8, "type": typ, "symmetric": True, "group_size": None, "strategy": strategy,
                "block_structure": None, "dynamic": dynamic, "actorder": None, "observer": observer,
                "observer_kwargs": {}}

    scheme = {"targets": ["Linear"], "weights": args("channel", False, "minmax"),
              "input_activations": args("token", True, None), "output_activations": None, "format": fmt}
    return {"quant_method": "compressed-tensors", "format": fmt, "quantization_status": "compressed",
            "config_groups": {"group_0": scheme}, "ignore": ignore, "kv_cache_scheme": None}


def decode_w8a8_channel(weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """float8_e4m3fn or int8 [N, K] and scales [N, 1] -> fp32 [N, K] = code * scale (exact: a code
    has at most 7 significant bits, a bf16 scale 8, fp32 holds 24)."""
    return weight.float() * weight_scale.float().reshape(weight.shape[0], 1)


def decode_fp8_block(weight: torch.Tensor, scale_inv: torch.Tensor, block: int = 128) -> torch.Tensor:
    """float8_e4m3fn [N, K] and fp32 [ceil(N/b), ceil(K/b)] -> fp32 [N, K] = code * block scale."""
    N, K = weight.shape
    s = scale_inv.float().repeat_interleave(block, 0)[:N].repeat_interleave(block, 1)[:, :K]
    return weight.float() * s


def decode_w4a16(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """compressed-tensors pack-quantized int32 [N, K/8] (codes q+8, input 8w+i in bits 4i..4i+3)
    and scales [N, K/group] -> fp32 [N, K] = q * scale."""
    p = packed.to(torch.int64) & 0xFFFFFFFF
    codes = torch.stack([(p >> (4 * i)) & 15 for i in range(8)], dim=-1).reshape(p.shape[0], -1)
    return (codes - 8).float() * scale.float().repeat_interleave(codes.shape[1] // scale.shape[1], dim=1)


def decode_projection(tensors: Dict[str, torch.Tensor], base: str) -> torch.Tensor:
    """fp32 [N, K] of one projection `base` ("....experts.3.up_proj.") in whatever format the
    checkpoint holds it (bf16, FP8 block, W4A16, NVFP4, FP8 / INT8 per channel), read from the file's
    own tensors."""
    if base + "weight_packed" in tensors:
        return decode_w4a16(tensors[base + "weight_packed"], tensors[base + "weight_scale"])
    w = tensors[base + "weight"]
    if base + "weight_scale_inv" in tensors:
        return decode_fp8_block(w, tensors[base + "weight_scale_inv"])
    if w.dtype == torch.uint8 and base + "weight_scale_2" in tensors:
        return decode_nvfp4(w, tensors[base + "weight_scale"], tensors[base + "weight_scale_2"])
    if w.dtype in (torch.float8_e4m3fn, torch.int8) and base + "weight_scale" in tensors:
        return decode_w8a8_channel(w, tensors[base + "weight_scale"])
    return w.float()


_QUANT_SUFFIXES = ("weight_scale_inv", "weight_packed", "weight_scale", "weight_shape", "weight_scale_2",
                   "input_scale")


def write_dequantized_twin(src: str, out: str) -> str:
    """The bf16 twin of a tiny checkpoint whose routed experts are quantized (the others bf16):
    the same model with each expert weight replaced by its dequantized value (rounded to bf16),
    no quantization_config. Stock vLLM on the twin computes the math the engine does on the
    quantized file (bf16 activations), independently of vLLM's quantized kernels (FP8 block
    MoE, for one, also quantizes the activations to FP8)."""
    from safetensors.torch import load_file, save_file
    tensors = load_file(os.path.join(src, "model.safetensors"))
    bases = {n[:n.rindex(".") + 1] for n in tensors if ".experts." in n}
    if any(n.endswith(_QUANT_SUFFIXES) and ".experts." not in n for n in tensors):
        raise ValueError(f"{src}: projections outside the routed experts are quantized; the twin needs them in bf16")
    twin = {n: t for n, t in tensors.items() if ".experts." not in n}
    for base in bases:
        twin[base + "weight"] = decode_projection(tensors, base).to(torch.bfloat16)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    config.pop("quantization_config", None)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    for name in ("generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        if os.path.exists(os.path.join(src, name)):
            with open(os.path.join(src, name)) as f_in, open(os.path.join(out, name), "w") as f_out:
                f_out.write(f_in.read())
    save_file(twin, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    return out


def make_checkpoint(arch: str, out: str, size: str = "tiny", seed: int = 0, layers: int = 0,
                    quant: str = "bf16", fp8_experts_only: bool = False, experts_only: bool = False) -> str:
    """layers: override the layer count (e.g. a shorter "big" model for a quicker benchmark start).
    quant: "bf16", "fp8" (block-quantized like DeepSeek-V3 / Qwen3-FP8), "w4a16" (int4 experts,
    compressed-tensors, like Kimi-K2-Thinking), "nvfp4" (ModelOpt NVFP4, like nvidia/Qwen3-30B-A3B-FP4),
    "fp8_channel" / "int8_channel" (compressed-tensors W8A8 per output channel, dynamic per-token
    activations, like RedHatAI/*-FP8-dynamic / *-quantized.w8a8); quantized variants: tiny only.
    experts_only (fp8, nvfp4, fp8_channel, int8_channel; fp8_experts_only is its old name): quantize
    the routed experts only, every other projection stays bf16 (vLLM's CPU platform has no FP8/NVFP4
    linear kernels)."""
    if quant not in QUANTS:
        raise ValueError(f"quant must be one of {', '.join(QUANTS)}")
    if quant != "bf16" and size != "tiny":
        raise ValueError("quantized variants are written for --size tiny only")
    if arch == "gpt_oss" and quant != "bf16":
        raise ValueError("gpt_oss checkpoints always hold MXFP4 experts (as released); use the default quant")
    if arch not in ARCHS:
        raise ValueError(f"unknown architecture {arch!r}; choose from {', '.join(ARCHS)}")
    if size not in ("tiny", "big"):
        raise ValueError("size must be tiny or big")
    s = dict(SHAPES[arch][size])
    if layers:
        s["L"] = layers
    os.makedirs(out, exist_ok=True)
    n_tok = write_tokenizer(out, min(s["V"], 2048))
    vocab = max(s["V"], n_tok)
    config = _config(arch, s, vocab)
    tensors = _weights(arch, s, vocab, seed) if size == "tiny" else None
    experts_only = experts_only or fp8_experts_only
    if quant == "fp8":
        tensors = quantize_fp8_block(tensors, experts_only=experts_only)
        config["quantization_config"] = _fp8_config(tensors)
    elif quant == "nvfp4":
        tensors = quantize_nvfp4(tensors, experts_only=experts_only)
        config["quantization_config"] = _nvfp4_config(tensors)
        with open(os.path.join(out, "hf_quant_config.json"), "w") as f:
            json.dump(_nvfp4_hf_quant_config(config["quantization_config"]), f, indent=1)
    elif quant == "w4a16":
        config["quantization_config"] = _w4a16_config(tensors)
        tensors = quantize_w4a16(tensors)
    elif quant in W8A8_CHANNEL:
        tensors = quantize_w8a8_channel(tensors, quant, experts_only=experts_only)
        config["quantization_config"] = _w8a8_channel_config(tensors, quant)
    eos = SPECIAL.index("<|im_end|>")
    config.update(bos_token_id=eos, eos_token_id=eos)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": eos, "eos_token_id": eos}, f)
    if tensors is not None:
        from safetensors.torch import save_file
        save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", required=True, choices=ARCHS)
    ap.add_argument("--out", required=True)
    ap.add_argument("--size", default="tiny", choices=("tiny", "big"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, default=0, help="override the number of layers")
    ap.add_argument("--quant", default="bf16", choices=QUANTS, help="expert/projection format (tiny only)")
    ap.add_argument("--experts-only", action="store_true",
                    help="fp8, nvfp4, fp8_channel, int8_channel: quantize the routed experts only "
                         "(other projections stay bf16)")
    a = ap.parse_args(argv)
    make_checkpoint(a.arch, a.out, a.size, a.seed, a.layers, a.quant, experts_only=a.experts_only)
    print(f"wrote {a.size} {a.arch} checkpoint to {a.out}"
          + (" (config + tokenizer only: serve with --load-format dummy)" if a.size == "big" else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
