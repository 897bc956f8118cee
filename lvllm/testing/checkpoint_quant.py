"""The quantized layouts of the tiny checkpoints: each format's tensors under the names its Hub
checkpoints use, with the config.json quantization_config its tool writes; the decoding of any
projection back to fp32 from the file's own tensors, and the bf16 twin of a quantized checkpoint.
The quantizers are lvllm.testing.quantizers', the dequantizers lk_moe.reference's."""
from __future__ import annotations

import json
import os
from typing import Callable, Dict

import torch

from lk_moe import formats
from lk_moe.reference import (dequantize_fp8_block, dequantize_mxfp4, dequantize_mxfp8, dequantize_nvfp4,
                              dequantize_per_channel, dequantize_wna16_int4)

from .quantizers import (MXFP4_GROUP, NVFP4_GROUP, W8A8_CHANNEL, pack_int4, quantize_fp8_block, quantize_int4,
                         quantize_mxfp4, quantize_mxfp8, quantize_nvfp4, quantize_w8a8_channel)

# The checkpoint's quant names (make_checkpoint's `quant`, the --quant flag) of the engine formats
# that have a name of their own here; every other row of lk_moe.formats is written under its own
# name. mxfp4 comes with the gpt_oss architecture (its checkpoints always hold MXFP4 experts).
_ALIASES = {"fp8_block": "fp8", "wna16_int4": "w4a16"}
_WITH_ARCH = ("mxfp4",)
# A second layout of an engine format: compressed-tensors' MXFP4 (Kimi-K3 as released).
_LAYOUTS = {"mxfp4_ct": "mxfp4", "mxfp4_ct_a8": "mxfp4"}  # a8: W4A8 (FP8 activations)
QUANTS = tuple(_ALIASES.get(n, n) for n in formats.NAMES if n not in _WITH_ARCH) + tuple(_LAYOUTS)
FORMAT_OF = dict({_ALIASES.get(n, n): n for n in formats.NAMES}, **_LAYOUTS)  # quant name -> engine format


def _is_router(name: str) -> bool:
    return name.endswith((".mlp.gate.weight", ".block_sparse_moe.gate.weight"))


def _quantized_projection(name: str, w: torch.Tensor, experts_only: bool) -> bool:
    """Whether a quantized checkpoint holds this tensor quantized: projection weights, never the
    router, embeddings or lm_head (and with experts_only the routed experts alone)."""
    if not name.endswith(".weight") or w.dim() != 2 or _is_router(name) or name.startswith(("lm_head", "model.embed")):
        return False
    return not experts_only or ".experts." in name


def _quantize_projections(tensors: Dict[str, torch.Tensor], experts_only: bool,
                          quantize: Callable[[torch.Tensor], Dict[str, torch.Tensor]]) -> Dict[str, torch.Tensor]:
    """Every projection weight `<base>weight` replaced by quantize(w)'s tensors (suffixes after <base>),
    in the file's order; everything else as it is."""
    out = {}
    for name, w in tensors.items():
        if not _quantized_projection(name, w, experts_only):
            out[name] = w
            continue
        base = name[:-len("weight")]
        out.update((base + suffix, t) for suffix, t in quantize(w).items())
    return out


def quantize_fp8_checkpoint(tensors: Dict[str, torch.Tensor], experts_only: bool = False) -> Dict[str, torch.Tensor]:
    """The layout of DeepSeek-V3 / Qwen3-FP8 checkpoints: every projection weight as float8_e4m3fn
    with `weight_scale_inv` fp32 [ceil(N/128), ceil(K/128)] (dequantized = code * scale); router,
    embeddings, norms, biases and lm_head stay as they are."""
    def fp8(w):
        q, scale = quantize_fp8_block(w)
        return {"weight": q, "weight_scale_inv": scale}
    return _quantize_projections(tensors, experts_only, fp8)


def _fp8_config(tensors: Dict[str, torch.Tensor]) -> dict:
    # Everything left in bf16 (router, lm_head, and with experts_only every other projection).
    keep = sorted(n[:-len(".weight")] for n, t in tensors.items()
                  if n.endswith(".weight") and t.dim() == 2 and t.dtype != torch.float8_e4m3fn
                  and not n.startswith("model.embed"))
    return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
            "weight_block_size": [128, 128], "modules_to_not_convert": keep}



def quantize_w4a16_checkpoint(tensors: Dict[str, torch.Tensor], group: int = 32) -> Dict[str, torch.Tensor]:
    """Routed experts as compressed-tensors W4A16 (Kimi-K2-Thinking's layout): per expert projection
    `weight_packed` int32 [N, K/8] (codes q+8), `weight_scale` bf16 [N, K/group], `weight_shape`
    [2]; symmetric (scale = group amax / 7), dequantized = q * scale. Everything else stays bf16."""
    out = {}
    for name, w in tensors.items():
        if ".experts." not in name or not name.endswith(".weight") or w.dim() != 2:
            out[name] = w
            continue
        q, scale, _ = quantize_int4(w.float(), group, code_max=7.0)
        base = name[:-len("weight")]
        out[base + "weight_packed"] = pack_int4(q + 8)
        out[base + "weight_scale"] = scale.contiguous()
        out[base + "weight_shape"] = torch.tensor(list(w.shape), dtype=torch.int64)
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


def nvfp4_projection(w: torch.Tensor, g: torch.Generator) -> Dict[str, torch.Tensor]:
    """One projection's ModelOpt NVFP4 tensors (suffix -> tensor), its input scale drawn from g."""
    q, sf, gs = quantize_nvfp4(w)
    return {"weight": q, "weight_scale": sf, "weight_scale_2": gs,
            "input_scale": (torch.rand((), generator=g) * 2e-3 + 1e-3).float()}  # ~amax(x) / 2688


def quantize_nvfp4_checkpoint(tensors: Dict[str, torch.Tensor], experts_only: bool = False,
                              seed: int = 0) -> Dict[str, torch.Tensor]:
    """Every projection (experts_only: routed experts only) as ModelOpt NVFP4; router, embeddings,
    norms, biases and lm_head stay as they are (ModelOpt excludes them)."""
    g = torch.Generator().manual_seed(seed)
    return _quantize_projections(tensors, experts_only, lambda w: nvfp4_projection(w, g))


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


# ModelOpt MXFP8 (OCP MX FP8), per quantized Linear `name`: name.weight float8_e4m3fn [N, K], name.weight_scale uint8
# [N, K/32] (e8m0: weight = code * 2^(scale - 127)); no input scales (dynamic activations). vLLM 0.33 reads them as
# ModelOptMxFp8FusedMoE for the experts (modelopt.py: quant_method "modelopt", quant_algo "MXFP8").


def quantize_mxfp8_checkpoint(tensors: Dict[str, torch.Tensor], experts_only: bool = False) -> Dict[str, torch.Tensor]:
    """Every projection (experts_only: the routed experts only) as ModelOpt MXFP8; router, embeddings, norms,
    biases and lm_head stay as they are."""
    def mxfp8(w):
        q, scale = quantize_mxfp8(w.float())
        return {"weight": q, "weight_scale": scale}
    return _quantize_projections(tensors, experts_only, mxfp8)


def _mxfp8_config(tensors: Dict[str, torch.Tensor]) -> dict:
    ignore = sorted(n[:-len(".weight")] for n, t in tensors.items()
                    if n.endswith(".weight") and t.dim() == 2 and t.dtype != torch.float8_e4m3fn
                    and not n.startswith("model.embed"))
    return {"quant_method": "modelopt", "quant_algo": "MXFP8", "kv_cache_scheme": None, "ignore": ignore,
            "producer": {"name": "modelopt", "version": "0.37.0"}}


# compressed-tensors W8A8 per channel (what llm-compressor's FP8_DYNAMIC and INT8 W8A8 presets write,
# e.g. RedHatAI/Qwen3-30B-A3B-FP8-dynamic, *-quantized.w8a8), per quantized Linear `name`: name.weight
# float8_e4m3fn or int8 [N, K], name.weight_scale [N, 1] in the model's dtype (compressed-tensors gives a
# scale the dtype of the weight it observed: bf16 here); symmetric, no zero point, weight = code *
# scale. Activations are quantized per token at run time: no input scales in the file. vLLM 0.33 reads
# them as CompressedTensorsW8A8Fp8MoEMethod / CompressedTensorsW8A8Int8MoEMethod for the experts.


def quantize_w8a8_channel_checkpoint(tensors: Dict[str, torch.Tensor], quant: str,
                                     experts_only: bool = False) -> Dict[str, torch.Tensor]:
    """Every projection (experts_only: the routed experts only) as compressed-tensors W8A8 per channel
    (quant "fp8_channel" or "int8_channel"); router, embeddings, norms, biases and lm_head stay as they are."""
    def w8a8(w):
        q, scale = quantize_w8a8_channel(w, quant)
        return {"weight": q, "weight_scale": scale}
    return _quantize_projections(tensors, experts_only, w8a8)


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



def quantize_ct_mxfp4_checkpoint(tensors: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """Routed experts as compressed-tensors MXFP4 (mxfp4-pack-quantized, Kimi-K3's release format): per expert
    projection `weight_packed` uint8 [N, K/2] (e2m1 codes, element 2i in the low nibble) and `weight_scale`
    uint8 [N, K/32] (e8m0 exponents); everything else stays bf16."""
    def mxfp4(w):
        blocks, scales = quantize_mxfp4(w.float())
        return {"weight_packed": blocks.flatten(-2).contiguous(), "weight_scale": scales}
    return _quantize_projections(tensors, True, mxfp4)


def ct_mxfp4_config(fp8_activations: bool = False) -> dict:
    """compressed-tensors' MXFP4 preset (W4A4: e2m1 weights and activations in groups of 32 with e8m0
    scales; fp8_activations: W4A8, dynamic per-token FP8 activations) on the routed experts only, matched by
    name (every other Linear stays bf16)."""
    def args(dynamic: bool) -> dict:
        return {"num_bits": 4, "type": "float", "symmetric": True, "group_size": MXFP4_GROUP, "strategy": "group",
                "dynamic": dynamic, "actorder": None, "observer": None if dynamic else "minmax"}
    acts = ({"num_bits": 8, "type": "float", "symmetric": True, "group_size": None, "strategy": "token",
             "dynamic": True, "actorder": None, "observer": None} if fp8_activations else args(True))
    scheme = {"targets": [r"re:.*\.experts\..*"], "weights": args(False), "input_activations": acts,
              "output_activations": None, "format": "mxfp4-pack-quantized"}
    return {"quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized", "quantization_status": "compressed",
            "config_groups": {"group_0": scheme}, "ignore": [], "kv_cache_scheme": None}


def decode_mxfp4(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """gpt-oss's blocks [..., N, K/32, 16] + scales [..., N, K/32] -> fp32 [..., N, K] (exact)."""
    return dequantize_mxfp4(blocks.flatten(-2), scales)


def decode_projection(tensors: Dict[str, torch.Tensor], base: str) -> torch.Tensor:
    """fp32 [N, K] of one projection `base` ("....experts.3.up_proj.") in whatever format the
    checkpoint holds it (bf16, FP8 block, W4A16, NVFP4, MXFP8, FP8 / INT8 per channel, DeepSeek-V4's MXFP4, NVFP4
    and FP8 block, compressed-tensors' MXFP4), read
    from the file's own tensors."""
    if base + "weight_packed" in tensors and tensors[base + "weight_packed"].dtype == torch.uint8:
        # compressed-tensors MXFP4: codes two per byte [N, K/2], e8m0 exponents [N, K/32]
        return dequantize_mxfp4(tensors[base + "weight_packed"], tensors[base + "weight_scale"])
    if base + "weight_packed" in tensors:  # [N, K/8] and [N, K/group]: the reference reads them K-first
        packed, scale = tensors[base + "weight_packed"], tensors[base + "weight_scale"]
        return dequantize_wna16_int4(packed.t()[None], scale.t()[None])[0]
    w = tensors[base + "weight"]
    if base + "scale" in tensors and tensors[base + "scale"].dtype == torch.float8_e8m0fnu:
        # DeepSeek-V4's MXFP4 experts: codes two per byte [N, K/2], e8m0 scales [N, K/32] named "scale"
        N = w.shape[0]
        return decode_mxfp4(w.view(torch.uint8).reshape(N, -1, 16), tensors[base + "scale"].view(torch.uint8))
    if base + "scale" in tensors:  # DeepSeek-V4's NVFP4 and FP8 block experts: their block scales named "scale" too
        if w.dtype == torch.uint8:
            return dequantize_nvfp4(w, tensors[base + "scale"], tensors[base + "weight_scale_2"])
        return dequantize_fp8_block(w[None], tensors[base + "scale"][None], block=(128, 128))[0]
    mx = next((tensors[base + n] for n in ("weight_scale", "weight_scale_inv")
               if base + n in tensors and tensors[base + n].dtype == torch.uint8), None)
    if w.dtype == torch.float8_e4m3fn and mx is not None:  # MXFP8: e8m0 bytes (MiniMax-M3's under weight_scale_inv)
        return dequantize_mxfp8(w, mx)
    if base + "weight_scale_inv" in tensors:
        return dequantize_fp8_block(w[None], tensors[base + "weight_scale_inv"][None], block=(128, 128))[0]
    if w.dtype == torch.uint8 and base + "weight_scale_2" in tensors:
        return dequantize_nvfp4(w, tensors[base + "weight_scale"], tensors[base + "weight_scale_2"])
    if w.dtype in (torch.float8_e4m3fn, torch.int8) and base + "weight_scale" in tensors:
        return dequantize_per_channel(w[None], tensors[base + "weight_scale"][None])[0]
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
    config.get("text_config", {}).pop("quantization_config", None)  # Kimi-K2.5 keeps it in its text model's
    config.pop("expert_dtype", None)  # DeepSeek-V4's: its experts' format
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    for name in ("generation_config.json", "tokenizer.json", "tokenizer_config.json", "preprocessor_config.json",
                 "video_preprocessor_config.json"):  # vision-language releases: vLLM builds their processors
        if os.path.exists(os.path.join(src, name)):
            with open(os.path.join(src, name)) as f_in, open(os.path.join(out, name), "w") as f_out:
                f_out.write(f_in.read())
    save_file(twin, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    return out


def quantize_checkpoint(tensors: Dict[str, torch.Tensor], quant: str, experts_only: bool = False):
    """A bf16 checkpoint's tensors as `quant` (one of QUANTS) -> (tensors, config.json's
    quantization_config or None, {file name: JSON} of the extra files the format's tool writes)."""
    fmt = FORMAT_OF[quant]
    if fmt == "bf16":
        return tensors, None, {}
    if fmt == "fp8_block":
        tensors = quantize_fp8_checkpoint(tensors, experts_only=experts_only)
        return tensors, _fp8_config(tensors), {}
    if fmt == "nvfp4":
        tensors = quantize_nvfp4_checkpoint(tensors, experts_only=experts_only)
        qc = _nvfp4_config(tensors)
        return tensors, qc, {"hf_quant_config.json": _nvfp4_hf_quant_config(qc)}
    if fmt == "wna16_int4":  # the config lists the bf16 Linears by name: read them before quantizing
        qc = _w4a16_config(tensors)
        return quantize_w4a16_checkpoint(tensors), qc, {}
    if fmt in W8A8_CHANNEL:
        tensors = quantize_w8a8_channel_checkpoint(tensors, quant, experts_only=experts_only)
        return tensors, _w8a8_channel_config(tensors, quant), {}
    if fmt == "mxfp8":
        tensors = quantize_mxfp8_checkpoint(tensors, experts_only=experts_only)
        qc = _mxfp8_config(tensors)
        hf = {"producer": qc["producer"], "quantization": {"quant_algo": "MXFP8", "kv_cache_quant_algo": None,
                                                           "exclude_modules": qc["ignore"]}}
        return tensors, qc, {"hf_quant_config.json": hf}
    if quant in ("mxfp4_ct", "mxfp4_ct_a8"):
        return quantize_ct_mxfp4_checkpoint(tensors), ct_mxfp4_config(fp8_activations=quant.endswith("_a8")), {}
    raise ValueError(f"no tiny checkpoint writer for expert format {fmt!r}")
