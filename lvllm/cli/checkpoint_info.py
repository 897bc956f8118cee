"""What a checkpoint directory holds, without loading it: expert vs other bytes per dtype, read
from the safetensors headers (8-byte length + JSON), or estimated from config.json when the
directory has no weights (e.g. a config for `--load-format dummy`)."""
from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, field
from typing import Dict, Optional

_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                "F8_E4M3": 1, "F8_E5M2": 1, "BOOL": 1, "F8_E8M0": 1, "U32": 4}


class CheckpointError(ValueError):
    """The directory is not a checkpoint this tool can read."""


@dataclass
class CheckpointInfo:
    path: str
    architecture: str = "?"
    model_type: str = "?"
    quant_method: Optional[str] = None
    num_layers: int = 0
    moe_layers: int = 0
    expert_bytes: int = 0  # routed experts (and their scales)
    other_bytes: int = 0  # everything else on the GPU: attention, dense/shared MLPs, embeddings, norms
    host_table_bytes: int = 0  # tables vLLM itself keeps in host RAM (DeepSeek-V4.1's Engram, Qwen4Exp's PLE)
    expert_dtypes: Dict[str, int] = field(default_factory=dict)  # dtype -> bytes of expert tensors
    estimated: bool = False  # from config.json arithmetic, not from weight files
    config: dict = field(default_factory=dict)  # config.json (its text config for multimodal models)

    @property
    def expert_bytes_per_layer(self) -> int:
        return self.expert_bytes // self.moe_layers if self.moe_layers else 0


def _is_host_table(name: str) -> bool:
    # DeepSeek-V4.1's "layers.N.engram.embed.weight" / ".scale" and Qwen3.8-Flash-Next's (Qwen4Exp) PLE n-gram
    # tables "...ple.ple_embedding.ngram_embedding.shard_<i>.weight": vLLM 0.33 keeps both in pinned host RAM
    # (EngramConfig.cpu_offload, its default) and reads them through unified addressing
    return ".engram.embed." in name or name.startswith("engram.embed.") or ".ngram_embedding." in name


# bytes per element of Qwen4Exp's PLE tables by ple_embedding_dtype (scales included; vLLM's own table formats)
_PLE_BYTES = {"float8_e4m3fn": 1.0, "nvfp4": 0.5625}


def ple_table_bytes(cfg: dict) -> int:
    """Qwen3.8-Flash-Next's (Qwen4Exp) PLE n-gram tables from its config: per PLE layer about ngram_vocab_size_base
    rows of ple_embed_dim (vLLM sums (ngram_size - 1) x heads_per_ngram prime-sized tables of ple_embed_dim / that
    many columns), bf16 unless ple_embedding_dtype says otherwise; 0 without PLE layers."""
    layers = cfg.get("ple_layer_ids") or []
    if not layers:
        return 0
    width = int(cfg.get("ple_embed_dim") or cfg.get("hidden_size", 0))
    per_element = _PLE_BYTES.get(cfg.get("ple_embedding_dtype") or "", 2.0)
    return int(len(layers) * int(cfg.get("ngram_vocab_size_base", 20_000_000)) * width * per_element)


def host_table_bytes(cfg: dict) -> int:
    """The tables vLLM 0.33 keeps in host RAM itself: DeepSeek-V4.1's Engram, Qwen3.8-Flash-Next's PLE."""
    return engram_table_bytes(cfg) + ple_table_bytes(cfg)


def engram_table_bytes(cfg: dict) -> int:
    """DeepSeek-V4.1's Engram tables from its config: rows per Engram layer x head_dim of FP8 codes plus one
    ue8m0 scale per 32 (vLLM 0.33's ParallelEngramEmbedding); 0 without Engram layers."""
    rows = cfg.get("engram_num_embeddings") or []
    if not cfg.get("engram_layer_ids") or not rows:
        return 0
    rows = rows if isinstance(rows, list) else [rows] * len(cfg["engram_layer_ids"])
    head = int(cfg.get("engram_head_dim", 0))
    return int(sum(int(r) for r in rows) * (head + head // 32))


def _is_routed_expert(name: str) -> bool:
    # "...mlp.experts.12.gate_proj.weight", "...block_sparse_moe.experts.3.w1.weight",
    # fused "...mlp.experts.gate_up_proj"; shared experts are not routed.
    return ".experts." in name and "shared_expert" not in name


def _read_header(path: str) -> dict:
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise CheckpointError(f"{path}: not a safetensors file (too short)")
        (n,) = struct.unpack("<Q", raw)
        if n > 100 << 20:
            raise CheckpointError(f"{path}: safetensors header of {n} bytes is not plausible")
        try:
            return json.loads(f.read(n))
        except json.JSONDecodeError as e:
            raise CheckpointError(f"{path}: unreadable safetensors header ({e})") from None


def moe_layer_indices(cfg: dict) -> list:
    """The decoder layers that have routed experts (dense first layers, mlp_only_layers and a sparse step
    left out; MiniMax-M3: moe_layer_freq, a 0/1 flag per layer; mlp_layer_types, where a config lists them: every
    kind but "dense" has experts: GLM-5's sparse, DeepSeek-V4's moe and hash_moe)."""
    layers = int(cfg.get("num_hidden_layers", 0))
    flags = cfg.get("moe_layer_freq")
    if isinstance(flags, list):
        return [i for i in range(layers) if i < len(flags) and flags[i]]
    kinds = cfg.get("mlp_layer_types")
    if isinstance(kinds, list):
        return [i for i in range(layers) if i < len(kinds) and kinds[i] != "dense"]
    dense = int(cfg.get("first_k_dense_replace", 0) or 0)
    only = set(cfg.get("mlp_only_layers", []) or [])
    step = int(cfg.get("decoder_sparse_step", 1) or 1)
    return [i for i in range(layers) if i >= dense and i not in only and (i + 1) % step == 0]


def _layer_counts(cfg: dict) -> tuple:
    return int(cfg.get("num_hidden_layers", 0)), len(moe_layer_indices(cfg))


# Rough bytes per expert weight by quantization method (scales included); ModelOpt names its
# algorithm separately: read_checkpoint folds it in ("modelopt/NVFP4").
_BYTES_PER_WEIGHT = {"fp8": 1.0, "compressed-tensors": 0.5, "mxfp4": 17 / 32, "modelopt_fp4": 0.56,
                     "modelopt/NVFP4": 0.56, "modelopt/FP8": 1.0, "compressed-tensors/mxfp4": 17 / 32,
                     "modelopt/MXFP8": 33 / 32, "mxfp8": 33 / 32}


def _is_ct_mxfp4(q: dict) -> bool:
    """A compressed-tensors config whose weights are 4-bit floats in groups of 32 (MXFP4, Kimi-K3's experts)."""
    weights = [g.get("weights") or {} for g in (q.get("config_groups") or {}).values() if isinstance(g, dict)]
    return any((w.get("type"), w.get("num_bits"), w.get("group_size")) == ("float", 4, 32) for w in weights)


# DeepSeek-V4's expert formats by its config (vLLM's DeepseekV4FP8Config: expert_dtype, and moe_quant_algo for fp4)
# -> (the engine's format, the _BYTES_PER_WEIGHT key); the other projections are FP8 under the same config
_DEEPSEEK_V4_EXPERTS = {("fp4", ""): ("mxfp4", "mxfp4"), ("fp4", "NVFP4"): ("nvfp4", "modelopt/NVFP4"),
                        ("fp8", ""): ("fp8_block", "fp8")}


def deepseek_v4_experts(cfg: dict):
    """(engine format, bytes key) of a DeepSeek-V4 / V4.1 config's routed experts, or None for any other config."""
    if "expert_dtype" not in cfg:
        return None
    q = cfg.get("quantization_config") or {}
    algo = (q.get("moe_quant_algo") or "").upper() if isinstance(q, dict) else ""
    return _DEEPSEEK_V4_EXPERTS.get((cfg["expert_dtype"], algo))


def expert_bytes_per_weight(info: "CheckpointInfo", cfg: dict) -> float:
    """Bytes per routed-expert weight, scales included: DeepSeek-V4's experts by their own fields first (MXFP4, NVFP4
    or FP8 block under an FP8 config for the rest), else the quantization method's, else bf16."""
    v4 = deepseek_v4_experts(cfg)
    return _BYTES_PER_WEIGHT[v4[1]] if v4 else _BYTES_PER_WEIGHT.get(info.quant_method or "", 2.0)


def expert_shape(cfg: dict) -> tuple:
    """(routed experts, the experts' input width, an expert's intermediate size) of a config (the text config
    of a multimodal one), under the names each family uses; 0 where the config has none. The input width is
    the hidden size, or the latent width of a latent MoE (Kimi-K3's routed_expert_hidden_size)."""
    E = cfg.get("num_experts") or cfg.get("n_routed_experts") or cfg.get("num_local_experts") or 0
    I = cfg.get("moe_intermediate_size") or cfg.get("intermediate_size") or 0
    H = cfg.get("routed_expert_hidden_size") or cfg.get("hidden_size", 0)
    return int(E), int(H), int(I)


def experts_per_token(cfg: dict, default: int = 0) -> int:
    """top-k of a config under the names each family uses (Kimi-Linear / K3: num_experts_per_token)."""
    return int(cfg.get("num_experts_per_tok") or cfg.get("num_experts_per_token") or cfg.get("moe_topk") or default)


def _estimate(info: CheckpointInfo, cfg: dict) -> None:
    """Expert bytes from the config's shapes (bf16 unless the config says otherwise)."""
    E, H, I = expert_shape(cfg)
    per_weight = expert_bytes_per_weight(info, cfg)
    info.expert_bytes = int(info.moe_layers * E * 3 * H * I * per_weight)
    V = cfg.get("vocab_size", 0)
    info.other_bytes = int(2 * V * H * 2 + info.num_layers * 4 * H * H * 2)  # embeddings + rough attention
    info.expert_dtypes = {f"~{per_weight:g} B/weight": info.expert_bytes}
    info.host_table_bytes = host_table_bytes(cfg)
    info.estimated = True


def _text_config(cfg: dict) -> dict:
    """The text model's config; a nested one gets the top level's quantization fields it lacks (DeepSeek-V4.1
    keeps its quantization config beside text_config, with the experts' dtype inside it)."""
    if "num_hidden_layers" in cfg or "text_config" not in cfg:
        return cfg
    text = dict(cfg["text_config"])
    for key in ("quantization_config", "expert_dtype"):
        if key not in text and key in cfg:
            text[key] = cfg[key]
    q = text.get("quantization_config")
    if "expert_dtype" not in text and isinstance(q, dict) and "expert_dtype" in q:
        text["expert_dtype"] = q["expert_dtype"]
    return text


def info_from_config(cfg: dict, path: str = "?", estimate: bool = False) -> CheckpointInfo:
    """What a config.json says (its text config for a multimodal model); `estimate`: the bytes too, from
    its shapes (for a model whose weight files are not at hand)."""
    top, cfg = cfg, _text_config(cfg)
    info = CheckpointInfo(path=path, architecture=(cfg.get("architectures") or top.get("architectures") or ["?"])[0],
                          model_type=cfg.get("model_type") or top.get("model_type", "?"), config=cfg)
    q = cfg.get("quantization_config") or {}
    info.quant_method = q.get("quant_method") if isinstance(q, dict) else None
    if info.quant_method == "modelopt" and q.get("quant_algo"):
        info.quant_method = f"modelopt/{q['quant_algo']}"
    if info.quant_method == "compressed-tensors" and _is_ct_mxfp4(q):
        info.quant_method = "compressed-tensors/mxfp4"
    info.num_layers, info.moe_layers = _layer_counts(cfg)
    if estimate:
        _estimate(info, cfg)
    return info


def read_checkpoint(path: str) -> CheckpointInfo:
    cfg_path = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_path):
        raise CheckpointError(f"{path}: no config.json (is this a Hugging Face checkpoint directory?)")
    with open(cfg_path) as f:
        cfg = json.load(f)
    info = info_from_config(cfg, path)
    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if not files:
        _estimate(info, info.config)
        return info
    for fname in files:
        for name, meta in _read_header(os.path.join(path, fname)).items():
            if name == "__metadata__":
                continue
            n = 1
            for d in meta["shape"]:
                n *= d
            size = n * _DTYPE_BYTES.get(meta["dtype"], 2)
            if _is_routed_expert(name):
                info.expert_bytes += size
                info.expert_dtypes[meta["dtype"]] = info.expert_dtypes.get(meta["dtype"], 0) + size
            elif _is_host_table(name):
                info.host_table_bytes += size
            else:
                info.other_bytes += size
    return info
