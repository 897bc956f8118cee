"""DeepSeek-V4's tensors for lvllm.testing.tiny_checkpoint, in the inference release's names (layers.<i>.attn.*,
ffn.*, hc_* mHC mixing weights, embed / head / norm; vLLM's V4 and V4.1 weight mappers rename them), and the layouts
of its routed experts vLLM reads (RELEASE_FORMATS: MXFP4 as released, FP8 block, NVFP4; the other projections under an
FP8 block config).
DeepSeek-V4.1 (lvllm.testing.deepseek_v41) reuses the decoder block's attention and MoE and adds its own parts.

Values as the other tiny checkpoints: projections N(0, 1/fan_in), the output head at a gain of 3, unit norms; the mHC
mixing weights and sink logits fp32, the projections bf16, hash tables int32.
"""
from __future__ import annotations

from typing import Dict

import torch

from .checkpoint_quant import nvfp4_projection
from .quantizers import quantize_fp8_block, quantize_mxfp4

# DeepSeek-V4's compressor: tokens per entry by attention layer type (overlapping entries: twice as wide)
COMPRESS = {"sliding_attention": 0, "compressed_sparse_attention": 4, "heavily_compressed_attention": 128}


def f32(w, name: str, *shape, scale: float = 0.02) -> None:
    w.t[name] = scale * torch.randn(*shape, generator=w.g)


def embedding_and_head(s: dict, vocab: int, w) -> None:
    w.t["embed.weight"] = torch.randn(vocab, s["H"], generator=w.g).to(torch.bfloat16)
    w.linear("head", vocab, s["H"], gain=3.0)
    w.norm("norm", s["H"])


def attention_block(s: dict, w, p: str) -> None:
    """A decoder layer's mHC mixing weights, its two norms and its attention's projections (MLA-like: a low-rank
    query, one shared KV head, grouped low-rank output), what every V4 / V4.1 layer has."""
    H, hc, hd = s["H"], s["hc"], s["hd"]
    mix = (2 + hc) * hc  # pre and post weights per stream, then the hc x hc residual mix
    for part in ("attn", "ffn"):
        f32(w, f"{p}.hc_{part}_fn", mix, hc * H)
        f32(w, f"{p}.hc_{part}_base", mix)
        w.t[f"{p}.hc_{part}_scale"] = torch.ones(3)
    w.norm(f"{p}.attn_norm", H)
    w.norm(f"{p}.ffn_norm", H)
    a = f"{p}.attn"
    f32(w, f"{a}.attn_sink", s["nh"], scale=1.0)
    w.linear(f"{a}.wq_a", s["q_lora"], H)
    w.norm(f"{a}.q_norm", s["q_lora"])
    w.linear(f"{a}.wq_b", s["nh"] * hd, s["q_lora"])
    w.linear(f"{a}.wkv", hd, H)
    w.norm(f"{a}.kv_norm", hd)
    w.linear(f"{a}.wo_a", s["o_groups"] * s["o_lora"], s["nh"] * hd // s["o_groups"])
    w.linear(f"{a}.wo_b", H, s["o_groups"] * s["o_lora"])


def moe(s: dict, w, p: str, vocab: int, hashed: bool) -> None:
    """The layer's router (a bias for the score correction, or a token-id -> experts table on hash-routed layers),
    its shared expert and its routed experts (w1 / w3 / w2 each)."""
    H, f = s["H"], f"{p}.ffn"
    w.linear(f"{f}.gate", s["E"], H)
    if hashed:
        w.t[f"{f}.gate.tid2eid"] = torch.stack([torch.randperm(s["E"], generator=w.g)[:s["K"]]
                                               for _ in range(vocab)]).to(torch.int32)
    else:
        w.t[f"{f}.gate.bias"] = 0.01 * torch.randn(s["E"], generator=w.g)
    w.mlp(f"{f}.shared_experts", H, s["I"], ("w1", "w3", "w2"))
    for e in range(s["E"]):
        w.mlp(f"{f}.experts.{e}", H, s["I"], ("w1", "w3", "w2"))


def weights(s: dict, vocab: int, w) -> None:
    """DeepSeek-V4's tensors into `w` (tiny_checkpoint's _Weights): its learned hc_head, and per layer type the
    compressor (ratio 4 overlapping, 128) and the ratio-4 layers' lightning indexer with its own compressor."""
    H, hc, hd = s["H"], s["hc"], s["hd"]
    embedding_and_head(s, vocab, w)
    f32(w, "hc_head_fn", hc, hc * H)
    f32(w, "hc_head_base", hc)
    w.t["hc_head_scale"] = torch.ones(1)
    for i in range(s["L"]):
        p = f"layers.{i}"
        attention_block(s, w, p)
        a = f"{p}.attn"
        ratio = COMPRESS[(s["layer_types"] or ["heavily_compressed_attention"])[i]]
        if ratio:
            width = hd * (2 if ratio == 4 else 1)  # CSA entries overlap their neighbours
            c = f"{a}.compressor"
            f32(w, f"{c}.ape", ratio, width)
            w.linear(f"{c}.wkv", width, H)
            w.linear(f"{c}.wgate", width, H)
            w.norm(f"{c}.norm", hd)
        if ratio == 4:  # the lightning indexer picks index_topk entries per query
            x = f"{a}.indexer"
            w.linear(f"{x}.wq_b", s["idx_heads"] * s["idx_dim"], s["q_lora"])
            w.linear(f"{x}.weights_proj", s["idx_heads"], H)
            f32(w, f"{x}.compressor.ape", ratio, 2 * s["idx_dim"])
            w.linear(f"{x}.compressor.wkv", 2 * s["idx_dim"], H)
            w.linear(f"{x}.compressor.wgate", 2 * s["idx_dim"], H)
            w.norm(f"{x}.compressor.norm", s["idx_dim"])
        moe(s, w, p, vocab, hashed=i < s["hash_layers"])


# The routed experts' formats vLLM 0.33's DeepSeek-V4 quantization config (DeepseekV4FP8Config) selects, each under
# the release's names (experts.<e>.w1 / w3 / w2: "weight" and "scale", which its weight mapper renames per format):
#   mxfp4: expert_dtype "fp4" (V4-Flash as released): codes two per byte (int8 [N, K/2]), e8m0 scales [N, K/32]
#   fp8:   expert_dtype "fp8" (V4-Flash-Base): e4m3 codes [N, K], fp32 scales per 128 x 128 block [N/128, K/128]
#   nvfp4: expert_dtype "fp4" and the config's moe_quant_algo "NVFP4" (ModelOpt's method): codes two per byte
#          (uint8 [N, K/2]), e4m3 scales per 16 inputs [N, K/16] as "scale", weight_scale_2 (the global scale) and
#          input_scale (fp32 scalars, ModelOpt's names). No NVFP4 V4 release is public here: this is the layout vLLM's
#          loader reads for it.
RELEASE_FORMATS = ("mxfp4", "fp8", "nvfp4")


def _expert_tensors(fmt: str, w: torch.Tensor, g: torch.Generator) -> Dict[str, torch.Tensor]:
    if fmt == "mxfp4":
        blocks, scales = quantize_mxfp4(w.float())
        return {"weight": blocks.reshape(w.shape[0], -1).view(torch.int8), "scale": scales.view(torch.float8_e8m0fnu)}
    if fmt == "fp8":
        codes, scales = quantize_fp8_block(w.float())
        return {"weight": codes, "scale": scales}
    t = nvfp4_projection(w.float(), g)
    t["scale"] = t.pop("weight_scale")  # the release's name for the block scales
    return t


def release_experts(tensors: Dict[str, torch.Tensor], config: dict, fmt: str = "mxfp4") -> Dict[str, torch.Tensor]:
    """DeepSeek-V4's routed experts in one of RELEASE_FORMATS; the other layers stay bf16 here, listed as not
    converted in the FP8 quantization config the release carries (vLLM's CPU platform has no FP8 linear kernels).
    config gets that quantization_config and the format's expert_dtype."""
    if fmt not in RELEASE_FORMATS:
        raise ValueError(f"DeepSeek-V4's experts are written as {', '.join(RELEASE_FORMATS)}, not {fmt!r}")
    out, keep_bf16, g = {}, set(), torch.Generator().manual_seed(0)
    for name, t in tensors.items():
        if ".experts." in name and name.endswith(".weight"):
            base = name[:-len("weight")]
            out.update({base + k: v for k, v in _expert_tensors(fmt, t, g).items()})
            continue
        out[name] = t
        if (name.endswith(".weight") and t.dim() == 2 and t.dtype == torch.bfloat16
                and name not in ("embed.weight", "head.weight")):
            keep_bf16.add(name[:-len(".weight")])
    # vLLM fuses wq_a + wkv and each compressor's wkv + wgate: their fused names are listed too
    fused = {n.rsplit(".", 1)[0] + ".fused_wqa_wkv" for n in keep_bf16 if n.endswith(".attn.wq_a")}
    fused |= {n.rsplit(".", 1)[0] + ".fused_wkv_wgate" for n in keep_bf16 if n.endswith("compressor.wkv")}
    release_quant(config, sorted(keep_bf16 | fused), fmt)
    return out


def release_quant(config: dict, ignored_layers=(), fmt: str = "mxfp4") -> None:
    """The release's quantization: the routed experts in fmt (one of RELEASE_FORMATS) under an FP8 block config
    (128 x 128 blocks; ue8m0 scales beside FP4 experts, fp32 beside FP8 ones) for the other projections, minus
    ignored_layers."""
    config["expert_dtype"] = "fp8" if fmt == "fp8" else "fp4"
    qc = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3"}
    if fmt != "fp8":
        qc["scale_fmt"] = "ue8m0"
    qc["weight_block_size"] = [128, 128]
    if fmt == "nvfp4":
        qc["moe_quant_algo"] = "NVFP4"
    config["quantization_config"] = qc
    if ignored_layers:
        qc["ignored_layers"] = list(ignored_layers)
