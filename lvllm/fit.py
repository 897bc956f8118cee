"""How a hybrid model's VRAM is shared on one rank: the KV cache vLLM needs for the requested context,
what the runtime itself needs, and what is left for the GPU expert cache. (Resident MoE layers are not
planned here: they stay an explicit setting, counted among the weights in use.)
Pure arithmetic on described machines and models (no GPU, no torch): the runtime's
`LVLLM_GPU_EXPERT_CACHE=auto` and `lvllm doctor --model` call the same `plan_vram`.

Order of claims on a rank's usable VRAM (total x vLLM's --gpu-memory-utilization):
  1. the non-expert weights (attention, dense and shared MLPs, embeddings) of this rank;
  2. the runtime's own reserve: CUDA graphs and activations (RESERVE_BYTES, the H200 measured 0.5-1.2
     GiB of graphs for default capture sizes) and, with streamed prefill, the staging ring;
  3. the KV cache for `kv_sequences` full-context sequences (vLLM refuses to start below one);
  4. the rest: the GPU expert cache, capped at one slot per expert of every hybrid layer.
When (1)-(3) do not fit even with one sequence, `FitError` says what is short by how much and what
would help.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Mapping

GiB = 1 << 30
# CUDA graphs (0.5-1.2 GiB measured on the H200 for vLLM's default capture sizes, sessions 17-19),
# activations of the largest prefill chunk and the allocator's slack.
RESERVE_BYTES = 2 * GiB
# The streamed-prefill staging ring (lvllm.runtime.staging_for: up to 4 slots of 256 MiB).
STAGING_BYTES = 1 * GiB
# Full-context sequences the KV cache is planned for when the request names none: one long request
# and one more at the same time.
DEFAULT_KV_SEQUENCES = 2


class FitError(ValueError):
    """The model does not fit this machine with the requested context; the message says why and what helps."""


def kv_bytes_per_token(cfg: Mapping, context: int, tp: int = 1, dtype_bytes: int = 2) -> int:
    """KV-cache bytes one token of context takes on one rank, from a Hugging Face config (its text
    config): MLA (kv_lora_rank: one latent of kv_lora_rank + qk_rope_head_dim per layer, the same on
    every rank), else K and V of the rank's KV heads per attention layer. Linear-attention layers keep
    a fixed state (none per token); sliding-window layers hold at most `sliding_window` tokens, so at a
    longer context they count by window / context. An upper bound for attention that compresses its
    cache further (DeepSeek-V4's CSA / HCA entries): those layers count as full ones."""
    layers = int(cfg.get("num_hidden_layers", 0))
    types = list(cfg.get("layer_types") or [])
    if not types and cfg.get("full_attention_interval"):
        n = int(cfg["full_attention_interval"])
        types = ["full_attention" if (i + 1) % n == 0 else "linear_attention" for i in range(layers)]
    types = types or ["full_attention"] * layers
    window = cfg.get("sliding_window")
    weight = 0.0
    for t in types:
        if "linear" in t:
            continue
        if "sliding" in t and window:
            weight += min(1.0, int(window) / max(1, context))
        else:
            weight += 1.0
    if cfg.get("kv_lora_rank"):
        per_layer = (int(cfg["kv_lora_rank"]) + int(cfg.get("qk_rope_head_dim", 0))) * dtype_bytes
    else:
        heads = int(cfg.get("num_attention_heads", 1))
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        head_dim = int(cfg.get("head_dim") or cfg.get("hidden_size", 0) // max(1, heads))
        per_rank_heads = max(1, -(-kv_heads // tp))  # fewer KV heads than ranks: each rank keeps one
        per_layer = 2 * per_rank_heads * head_dim * dtype_bytes
    return int(round(weight * per_layer))


@dataclass(frozen=True)
class VramRequest:
    """One rank's side of a hybrid model. Bytes are per rank."""
    usable_bytes: int            # total VRAM x vLLM's gpu_memory_utilization
    weight_bytes: int            # non-expert weights on this rank (the runtime: VRAM in use when it plans)
    kv_bytes_per_token: int      # on this rank (kv_bytes_per_token(cfg, context, tp))
    max_model_len: int
    expert_cache: bool = True    # the rest goes to the GPU expert cache
    expert_slot_bytes: int = 0   # one expert's slot (0: unknown yet; the cache caps itself)
    cache_slots_max: int = 0     # slots that hold every expert of every hybrid layer (with expert_slot_bytes)
    kv_sequences: int = DEFAULT_KV_SEQUENCES
    gpu_prefill: bool = True     # streamed prefill needs its staging ring


@dataclass
class VramPlan:
    kv_bytes: int
    kv_sequences: float          # full-context sequences the KV cache holds
    reserve_bytes: int
    cache_bytes: int             # VRAM for the GPU expert cache (whole slots)
    lines: List[str] = field(default_factory=list)  # one per decision, for the startup summary and doctor


def _gib(n: float) -> str:
    return f"{n / GiB:.2f} GiB"


def plan_vram(req: VramRequest) -> VramPlan:
    if req.usable_bytes <= 0 or req.max_model_len < 1 or req.kv_sequences < 1:
        raise ValueError("usable_bytes, max_model_len and kv_sequences must be positive")
    reserve = RESERVE_BYTES + (STAGING_BYTES if req.gpu_prefill else 0)
    one_seq = req.kv_bytes_per_token * req.max_model_len
    fixed = req.weight_bytes + reserve
    room = req.usable_bytes - fixed
    if room < one_seq:
        short = one_seq - room
        raise FitError(
            f"VRAM: {_gib(req.usable_bytes)} usable per GPU holds the non-expert weights "
            f"({_gib(req.weight_bytes)}) and lvllm's reserve ({_gib(reserve)}) but not "
            f"the KV cache of one {req.max_model_len}-token sequence ({_gib(one_seq)}): short by {_gib(short)}. "
            f"Options: a shorter --max-model-len (at most ~{max(0, room) // max(1, req.kv_bytes_per_token)} tokens "
            f"fit), a higher --gpu-memory-utilization, --tensor-parallel-size 2, or a KV-cache dtype of fp8")
    lines = []
    kv = one_seq * req.kv_sequences
    seqs = float(req.kv_sequences)
    if kv > room:
        seqs = room / max(1, one_seq)
        kv = room
        lines.append(f"KV cache {_gib(kv)}: {seqs:.1f} sequences of {req.max_model_len} tokens fit, not the "
                     f"{req.kv_sequences} planned; no VRAM left for the GPU expert cache")
    else:
        lines.append(f"KV cache {_gib(kv)} planned: {req.kv_sequences} sequences of {req.max_model_len} tokens "
                     f"({req.kv_bytes_per_token / 1024:.1f} KiB a token; vLLM gives the KV cache all the VRAM "
                     f"left after startup)")
    left = room - kv
    cache = 0
    if req.expert_cache:
        cache, detail = max(0, left), ""
        if req.expert_slot_bytes > 0 and req.cache_slots_max > 0:
            slots = min(req.cache_slots_max, cache // req.expert_slot_bytes)
            cache = slots * req.expert_slot_bytes
            detail = f" ({slots} of {req.cache_slots_max} expert slots of {req.expert_slot_bytes / 2**20:.1f} MiB)"
        lines.append(f"GPU expert cache {_gib(cache)}{detail}: what is left after the weights "
                     f"({_gib(req.weight_bytes)}), lvllm's reserve ({_gib(reserve)}) and the KV cache")
    return VramPlan(kv, seqs, reserve, cache, lines)


def auto_cache_plan(text_cfg: Mapping, *, total_bytes: int, free_bytes: int, gpu_memory_utilization: float,
                    max_model_len: int, tp: int, kv_dtype_bytes: int, gpu_prefill: bool) -> VramPlan:
    """LVLLM_GPU_EXPERT_CACHE=auto on one rank, planned when the model's first hybrid layer loads: vLLM
    has allocated every non-expert weight by then (the VRAM in use), the experts stay in host RAM. The
    cache gets what is left after the KV cache of DEFAULT_KV_SEQUENCES full-context sequences and lvllm's
    reserve (the cache caps itself at one slot per expert)."""
    req = VramRequest(usable_bytes=int(total_bytes * gpu_memory_utilization), weight_bytes=total_bytes - free_bytes,
                      kv_bytes_per_token=kv_bytes_per_token(text_cfg, max_model_len, tp, kv_dtype_bytes),
                      max_model_len=max_model_len, gpu_prefill=gpu_prefill)
    return plan_vram(req)
