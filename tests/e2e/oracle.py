"""An fp32 oracle for the greedy-token flips of the e2e switch comparison (compare.py).

A flip between two bf16 runs (plugin on vs off) is legitimate only where exact math itself is
(nearly) undecided:
- at the output: the fp32 top-1/top-2 margin between the two tokens is small, or
- at a router: for the token whose forward produced the flipped prediction, some MoE layer's
  top-k boundary (k-th vs (k+1)-th selection score, as that architecture selects experts) is within
  the bf16 noise of that score. Then either implementation may pick a different expert set, which
  changes that token's output by O(1) nats without anything being wrong.
Anything else (a large fp32 margin and every router boundary far outside the noise) is a bug.

The check runs HF transformers (an implementation independent of vLLM and of the plugin): one
teacher-forced forward in fp32 over prompt + generated prefix, with forward hooks on each MoE
layer's router, and the same forward in bf16 to measure the per-layer noise of the router scores.

Router modules hooked (transformers 5.24): Qwen3MoeTopKRouter, MixtralTopKRouter, GptOssTopKRouter,
Qwen3NextTopKRouter, Qwen3_5MoeTopKRouter, DeepseekV3TopkRouter, Glm4MoeTopkRouter and
GlmMoeDsaTopkRouter (not MiniMaxM2TopKRouter: its selection bias is a forward argument). Each returns
(router_logits [T, E], topk_weights, topk_indices); we take router_logits (output 0) and derive the
selection score ourselves:
- qwen3_moe, qwen3_next, qwen3_5_moe, mixtral: softmax then top-k; softmax is monotone, so the
  boundary is the same on the logits, and logit differences are what bf16 rounding perturbs. Score = logit.
- gpt_oss: top-k on the logits (router bias included). Score = logit.
- deepseek_v3, glm4_moe, glm_moe_dsa: score = sigmoid(logit) + e_score_correction_bias; groups ranked by the
  sum of their top-2 scores, the topk_group best groups kept, then top-k among their experts. The
  boundary gap is the min of the expert-level gap (within the kept groups) and the group-level gap
  (topk_group-th vs next group score; a group score sums two scores, so its noise is up to twice
  the per-score noise: the factor in explain_flip covers that).

Caveat (CPU, tiny checkpoints, 64 random tokens): the per-layer noise includes the bf16 drift
carried in from earlier layers and grows with depth (RMS 0.3% of the scores' spread in the first
MoE layer, 5-14% in the last), so with factor 4, 77-98% of positions have some layer's gap within
4 x noise (27-61% within 1 x). The gap test alone explains most flips. swapped_margin (fp32, swap
the boundary expert at the last token, see whether the output moves towards tok_b) looked sharper,
but a CPU calibration with injected bugs (docs/results/2026-11-30_epyc2c_oracle_calibration.log)
showed that no per-flip rule separates bug flips from benign ones on these tiny models; the flip
count against a baseline does. So the e2e tests judge by that count (teacher_forced_logprobs feeds
compare.py's teacher-forced check) and print these per-flip notes only on request
(LVLLM_E2E_SPIKE_NOTES=1).

    python -m tests.e2e.oracle MODEL_DIR TOKEN_IDS_JSON TOK_A TOK_B
"""
from __future__ import annotations

import functools
import json
import math
import operator
import os
import re
import sys
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Dict, List, Sequence

import torch

ROUTER_CLASSES = ("Qwen3MoeTopKRouter", "MixtralTopKRouter", "GptOssTopKRouter", "Qwen3NextTopKRouter",
                  "Qwen3_5MoeTopKRouter", "DeepseekV3TopkRouter", "Glm4MoeTopkRouter", "GlmMoeDsaTopkRouter")
GROUPED = ("DeepseekV3TopkRouter", "Glm4MoeTopkRouter", "GlmMoeDsaTopkRouter")
ORACLE_MARGIN = 0.5  # nats: compare.py's FLIP_MARGIN, a near-tie at the output


@dataclass
class RouterGaps:
    layers: List[int]  # decoder-layer index of each MoE layer, in order
    gaps: torch.Tensor  # fp32 run: [positions, len(layers)] top-k boundary gap (fp64)
    noise: torch.Tensor  # [len(layers)]: RMS over positions of bf16 - fp32 selection score
    logprobs: torch.Tensor  # fp32 next-token logprobs at the last position [vocab]
    scores: Dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> fp32 selection scores [T, E]


@dataclass
class FlipExplanation:
    margin: float  # fp32 |logprob(tok_a) - logprob(tok_b)| at the last position
    ratio: float  # smallest gap/noise over MoE layers at the last token
    layer: int  # decoder-layer index where that ratio is reached
    gap: float  # that layer's boundary gap at the last token
    noise: float  # that layer's noise
    explained: bool

    def __str__(self) -> str:
        return (f"fp32 margin {self.margin:.3f}; tightest router boundary at the last token: layer "
                f"{self.layer}, gap {self.gap:.2e} = {self.ratio:.1f} x noise {self.noise:.2e}; "
                f"{'explained' if self.explained else 'NOT explained'}")


def _check_tokens(token_ids: Sequence[int], vocab: int) -> List[int]:
    ids = []
    for t in token_ids:
        try:
            if isinstance(t, bool):
                raise TypeError
            ids.append(operator.index(t))  # ints, numpy/torch integer scalars; not floats
        except TypeError:
            raise ValueError(f"token ids must be integers, got {t!r}") from None
        if not 0 <= ids[-1] < vocab:
            raise ValueError(f"token id {t} outside the vocabulary [0, {vocab})")
    if not ids:
        raise ValueError("token_ids is empty: need the prompt plus the generated prefix")
    return ids


def _vocab(model_dir: str) -> int:
    from transformers import AutoConfig
    return AutoConfig.from_pretrained(model_dir).get_text_config().vocab_size


def _partial_rope_from_rotary_dim(config) -> None:
    """MiniMax-M2 releases say partial RoPE as `rotary_dim` (64 of head_dim 128). transformers 5.20 turns it
    into rope_parameters' partial_rotary_factor; 5.17 (the GPU machine's) ignores it and rotates every
    dimension, a truth that vLLM (which reads rotary_dim) and stock vLLM alike missed by ~1.2 nats (session
    20). Give such a config the factor it implies, as the newer transformers does."""
    rotary_dim = getattr(config, "rotary_dim", None)
    rope = getattr(config, "rope_parameters", None)
    head_dim = getattr(config, "head_dim", None)
    if rotary_dim and head_dim and isinstance(rope, dict) and "partial_rotary_factor" not in rope:
        rope["partial_rotary_factor"] = rotary_dim / head_dim


def _require_loaded(model_dir: str, info: dict, but=()) -> None:
    """Every weight of the model transformers built came from the checkpoint (from_pretrained's loading info), but those
    whose names hold one of `but`: transformers only warns and initialises the rest at random."""
    unloaded = [str(k) for k in list(info["missing_keys"]) + list(info["mismatched_keys"])
                if not any(b in str(k) for b in but)]
    if unloaded:
        raise RuntimeError(f"{model_dir}: transformers left {sorted(unloaded)[:8]} unloaded")


class TextModelWithHead(torch.nn.Module):
    """A text model transformers implements without a causal-LM class (GLM-5.3's Glm5NextTextModel: only its
    vision-language model has a head there), under the checkpoint's own lm_head."""

    def __init__(self, model, lm_head: torch.Tensor):
        super().__init__()
        self.model = model
        self.lm_head = torch.nn.Linear(lm_head.shape[1], lm_head.shape[0], bias=False, dtype=lm_head.dtype)
        self.lm_head.weight.data.copy_(lm_head)

    @classmethod
    def from_checkpoint(cls, model_dir: str, config, dtype: torch.dtype) -> "TextModelWithHead":
        from safetensors import safe_open
        from transformers import AutoModel

        from lvllm.testing.hub_layout import use_family_conversion
        # the Hub layout's per-expert tensors reach the fused model through the family's conversion where the
        # installed transformers lists none under the text config (5.17 for GLM-5.3); every tensor placed
        if config.model_type.endswith("_text"):
            use_family_conversion(config.model_type, config.model_type.removesuffix("_text"))
        model, info = AutoModel.from_pretrained(model_dir, config=config, dtype=dtype, output_loading_info=True)
        _require_loaded(model_dir, info)  # the text model, "model." stripped; lm_head is read below
        with safe_open(os.path.join(model_dir, "model.safetensors"), "pt") as f:
            return cls(model, f.get_tensor("lm_head.weight").to(dtype))

    def forward(self, input_ids, use_cache=False):
        hidden = self.model(input_ids=input_ids, use_cache=use_cache).last_hidden_state
        return SimpleNamespace(logits=self.lm_head(hidden))


# MiniMax-M3's checkpoint (MiniMaxM3SparseForConditionalGeneration, the release's names: the text model under
# language_model.) -> transformers' MiniMaxM3VLForCausalLM (its text model): the indexer's projections under
# self_attn.indexer, the MoE under mlp. with its router as mlp.gate, experts fused to [E, 2I, H] gate-then-up (and
# [E, H, I]), gate/up pairs fused gate-then-up.
_MINIMAX_M3_RENAMES = ((".self_attn.index_q_", ".self_attn.indexer.q_"), (".self_attn.index_k_", ".self_attn.indexer.k_"),
                       (".block_sparse_moe.e_score_correction_bias", ".mlp.gate.e_score_correction_bias"),
                       (".block_sparse_moe.", ".mlp."))


def minimax_m3_as_transformers(tensors: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    out, experts, pairs = {}, {}, {}
    for name, t in tensors.items():
        name = name.removeprefix("language_model.")
        if name.startswith("model.mtp."):  # the MTP modules: vLLM's draft, not part of the text model
            continue
        for old, new in _MINIMAX_M3_RENAMES:
            name = name.replace(old, new)
        m = re.fullmatch(r"(.*\.mlp\.experts)\.(\d+)\.(w[123])\.weight", name)
        if m:
            experts.setdefault(m.group(1), {}).setdefault(m.group(3), {})[int(m.group(2))] = t
            continue
        m = re.fullmatch(r"(.*)\.(gate|up)_proj\.weight", name)
        if m:
            pairs.setdefault(m.group(1), {})[m.group(2)] = t
            continue
        out[name] = t
    for prefix, w in experts.items():
        n = len(w["w1"])
        out[f"{prefix}.gate_up_proj"] = torch.stack([torch.cat([w["w1"][e], w["w3"][e]]) for e in range(n)])
        out[f"{prefix}.down_proj"] = torch.stack([w["w2"][e] for e in range(n)])
    for prefix, p in pairs.items():
        out[f"{prefix}.gate_up_proj.weight"] = torch.cat([p["gate"], p["up"]])
    return out


def _minimax_m3_text(model_dir: str, dtype: torch.dtype):
    """MiniMax-M3's text checkpoint in transformers' own MiniMax-M3 text model, every tensor placed (strict)."""
    from safetensors.torch import load_file
    from transformers import MiniMaxM3VLForCausalLM, MiniMaxM3VLTextConfig
    with open(os.path.join(model_dir, "config.json")) as f:
        top = json.load(f)
    text = {k: v for k, v in top["text_config"].items() if k != "model_type"}
    text.update(bos_token_id=top.get("bos_token_id"), eos_token_id=top.get("eos_token_id"))
    model = MiniMaxM3VLForCausalLM(MiniMaxM3VLTextConfig(**text))
    model.load_state_dict(minimax_m3_as_transformers(load_file(os.path.join(model_dir, "model.safetensors"))))
    return model.to(dtype)


# Checkpoints of vLLM's own layout that transformers implements under other names (by the config's architecture)
CONVERTED = {"MiniMaxM3SparseForConditionalGeneration": _minimax_m3_text}
# Architectures the pinned transformers does not implement at all: no fp32 truth (their e2e runs are judged by the
# suite's criterion without the teacher-forced check, which then allows fewer spike flips)
NOT_IN_TRANSFORMERS = ("KimiK3ForConditionalGeneration", "DeepseekV41ForCausalLM")


def has_fp32_truth(model_dir: str) -> bool:
    """Whether transformers implements the checkpoint's architecture (NOT_IN_TRANSFORMERS: not)."""
    with open(os.path.join(model_dir, "config.json")) as f:
        return not set(json.load(f).get("architectures") or ()) & set(NOT_IN_TRANSFORMERS)


def _load(model_dir: str, dtype: torch.dtype, device: str):
    """The checkpoint in HF transformers at `dtype`. MXFP4 experts (gpt-oss) are dequantized on load
    (transformers would otherwise want its own MXFP4 GPU kernels)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    extra = {}
    config = AutoConfig.from_pretrained(model_dir)
    quant = getattr(config, "quantization_config", None) or {}
    if (quant.get("quant_method") if isinstance(quant, dict) else getattr(quant, "quant_method", None)) == "mxfp4":
        from transformers import Mxfp4Config
        extra["quantization_config"] = Mxfp4Config(dequantize=True)
    _partial_rope_from_rotary_dim(config)
    # vision-language releases (a vision tower beside the text model): the whole model, text prompts
    arch = (getattr(config, "architectures", None) or [""])[0]
    if arch in CONVERTED:
        model = CONVERTED[arch](model_dir, dtype)
    elif getattr(config, "vision_config", None) is not None:
        model, info = AutoModelForImageTextToText.from_pretrained(model_dir, config=config, dtype=dtype,
                                                                  output_loading_info=True, **extra)
        # the text prompts' truth: every text weight loaded (releases written without their vision tower's weights,
        # served with --language-model-only, leave the tower at transformers' initialisation, unused)
        _require_loaded(model_dir, info, but=(".visual.", "vision_tower", "mm_projector"))
    elif config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        model = TextModelWithHead.from_checkpoint(model_dir, config, dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(model_dir, config=config, dtype=dtype, **extra)
    # transformers 5.17 (the GPU machine's) leaves dequantized MXFP4 experts in bf16 when fp32 is asked
    # for, and its grouped_mm then runs those experts in bf16: a "fp32" gpt-oss truth 0.03 nats off,
    # shape-dependent. bf16 -> fp32 is exact (and so is MXFP4 -> bf16), so cast what was left behind.
    model = model.to(device=device, dtype=dtype).eval()
    left = sorted({str(p.dtype) for p in model.parameters() if p.is_floating_point() and p.dtype != dtype})
    if left:
        raise RuntimeError(f"{model_dir}: parameters in {left} after loading at {dtype}")
    if dtype == torch.float32:
        # The truth must be IEEE fp32: no TF32 on the GPU, and no bf16 passes on the CPU (oneDNN may
        # use AMX-BF16 for fp32 matmuls once a reduced precision is allowed, e.g. by an imported library).
        torch.set_float32_matmul_precision("highest")
        mkldnn_matmul = getattr(torch.backends.mkldnn, "matmul", None)
        if mkldnn_matmul is not None and hasattr(mkldnn_matmul, "fp32_precision"):
            mkldnn_matmul.fp32_precision = "ieee"
        if device != "cpu":
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
    return model


@functools.cache
def _say_versions_once():
    """The truth depends on transformers (5.17 on the GPU machine kept MXFP4 experts in bf16): name it
    in the e2e log, once per process."""
    import transformers
    print(f"[e2e] fp32 oracle: transformers {transformers.__version__}, torch {torch.__version__}", flush=True)


def teacher_forced_logprobs(model_dir: str, prompts: Sequence[Sequence[int]], device: str = "cpu") -> List[torch.Tensor]:
    """fp32 truth for compare.py's teacher-forced check: per prompt a [len - 1, vocab] fp32 log-softmax
    on the CPU, row i = the prediction of prompt[i + 1] from prompt[:i + 1] (what vLLM's
    prompt_logprobs report for position i + 1)."""
    vocab = _vocab(model_dir)
    checked = [_check_tokens(p, vocab) for p in prompts]
    if any(len(p) < 2 for p in checked):
        raise ValueError("each scored prompt needs at least 2 tokens")
    model = _load(model_dir, torch.float32, device)
    _say_versions_once()
    out = []
    with torch.no_grad():
        for ids in checked:
            logits = model(torch.tensor([ids], device=device), use_cache=False).logits[0, :-1]
            out.append(torch.log_softmax(logits.float(), dim=-1).cpu())
    return out


def _forward(model_dir: str, ids: List[int], dtype: torch.dtype, device: str):
    """One teacher-forced forward; returns ({layer: (router module, logits [T, E] fp32)}, last logits)."""
    model = _load(model_dir, dtype, device)
    captured: Dict[int, tuple] = {}
    handles = []
    for name, mod in model.named_modules():
        if type(mod).__name__ in ROUTER_CLASSES:
            layer = int(re.search(r"layers\.(\d+)\.", name).group(1))

            def hook(m, args, out, layer=layer):
                captured[layer] = (m, out[0].detach().reshape(-1, out[0].shape[-1]).float())
            handles.append(mod.register_forward_hook(hook))
    if not handles:
        raise ValueError(f"{model_dir}: no known MoE router module ({', '.join(ROUTER_CLASSES)})")
    try:
        with torch.no_grad():
            out = model(torch.tensor([ids], device=device), use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return dict(sorted(captured.items())), out.logits[0, -1].float()


def selection_scores(router, logits: torch.Tensor) -> torch.Tensor:
    """The scores the router ranks experts by (see the module docstring)."""
    if type(router).__name__ in GROUPED:
        return logits.sigmoid() + router.e_score_correction_bias.float().to(logits.device)
    return logits


def _kth_gap(scores: torch.Tensor, k: int) -> torch.Tensor:
    """k-th minus (k+1)-th highest per row; inf where there is no (k+1)-th candidate."""
    if scores.shape[-1] <= k:
        return torch.full(scores.shape[:-1], math.inf, dtype=scores.dtype, device=scores.device)
    top = scores.topk(k + 1, dim=-1).values
    gap = top[..., k - 1] - top[..., k]
    return torch.where(torch.isfinite(top[..., k]), gap, torch.full_like(gap, math.inf))


def _kept_groups(router, scores: torch.Tensor):
    """Grouped routers: (scores of experts outside the kept groups set to -inf [T, E], group scores
    [T, n_group]); groups ranked by the sum of their top-2 scores."""
    grouped = scores.view(scores.shape[0], router.num_group, -1)
    group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)
    kept = torch.zeros_like(group_scores, dtype=torch.bool)
    kept.scatter_(1, group_scores.topk(router.topk_group, dim=-1).indices, True)
    return grouped.masked_fill(~kept[..., None], -math.inf).reshape(scores.shape), group_scores


def boundary_gaps(router, scores: torch.Tensor) -> torch.Tensor:
    """Per position, the top-k boundary gap of this router on its selection scores [T, E]."""
    k = router.top_k
    if type(router).__name__ not in GROUPED:
        return _kth_gap(scores, k)
    masked, group_scores = _kept_groups(router, scores)
    return torch.minimum(_kth_gap(masked, k), _kth_gap(group_scores, router.topk_group))


def router_gaps(model_dir: str, token_ids: Sequence[int], device: str = "cpu", noise: bool = True) -> RouterGaps:
    """fp32 top-k boundary gaps per position and MoE layer over token_ids (prompt + generated
    prefix), the fp32 next-token logprobs after the last token, and (noise=True) the per-layer RMS
    of bf16 - fp32 selection scores over the same tokens."""
    ids = _check_tokens(token_ids, _vocab(model_dir))
    routers, last = _forward(model_dir, ids, torch.float32, device)
    layers = list(routers)
    scores = {l: selection_scores(m, x).double() for l, (m, x) in routers.items()}
    gaps = torch.stack([boundary_gaps(routers[l][0], scores[l]) for l in layers], dim=1).cpu()
    rms = torch.full((len(layers),), math.nan, dtype=torch.float64)
    if noise:
        low, _ = _forward(model_dir, ids, torch.bfloat16, device)
        if list(low) != layers:
            raise ValueError(f"bf16 run hooked layers {list(low)}, fp32 run {layers}")
        # the fp32 router scores the bf16 logits: the same bias for both, only the logits' noise
        rms = torch.stack([(selection_scores(routers[l][0], x).double() - scores[l]).pow(2).mean().sqrt()
                           for l, (_, x) in low.items()]).cpu()
    return RouterGaps(layers, gaps, rms, torch.log_softmax(last.double(), dim=-1).cpu(),
                      {l: s.cpu() for l, s in scores.items()})


def swapped_margin(model_dir: str, token_ids: Sequence[int], tok_a: int, tok_b: int, layer: int,
                   device: str = "cpu") -> float:
    """A counterfactual for a router near-tie: logprob(tok_a) - logprob(tok_b) at the last position
    of an fp32 forward where, at the last token only, `layer`'s router takes the best unselected
    expert instead of its weakest selected one (same routing weight). If this moves the margin
    towards tok_b by about the observed spike, the near-tie explains the flip; if the output
    barely moves, a near-tie at that layer is no explanation."""
    ids = _check_tokens(token_ids, _vocab(model_dir))
    _check_tokens([tok_a, tok_b], _vocab(model_dir))
    model = _load(model_dir, torch.float32, device)
    routers = {int(re.search(r"layers\.(\d+)\.", n).group(1)): m for n, m in model.named_modules()
               if type(m).__name__ in ROUTER_CLASSES}
    if layer not in routers:
        raise ValueError(f"layer {layer} has no MoE router (MoE layers: {sorted(routers)})")

    def swap(m, args, out):
        logits, weights, idx = out
        score = selection_scores(m, logits[-1].float())
        chosen = idx[-1]
        weakest = int(score[chosen].argmin())  # slot of the lowest-scoring selected expert
        # the (k+1)-th candidate: for grouped routers, from the kept groups only
        rest = _kept_groups(m, score[None])[0][0] if type(m).__name__ in GROUPED else score.clone()
        rest[chosen] = -math.inf
        idx = idx.clone()
        idx[-1, weakest] = rest.argmax()
        return logits, weights, idx

    h = routers[layer].register_forward_hook(swap)
    try:
        with torch.no_grad():
            lp = torch.log_softmax(model(torch.tensor([ids], device=device), use_cache=False).logits[0, -1].double(), -1)
    finally:
        h.remove()
    return float(lp[tok_a] - lp[tok_b])


def _ratio(gap: float, noise: float) -> float:
    if noise > 0:
        return gap / noise
    return 0.0 if gap == 0 else math.inf  # an exact tie is a tie at any noise


def explain_flip(model_dir: str, token_ids: Sequence[int], tok_a: int, tok_b: int, factor: float = 4.0,
                 device: str = "cpu") -> FlipExplanation:
    """Whether exact math explains a greedy flip between tok_a and tok_b predicted after token_ids
    (prompt + the generated tokens both runs agreed on). The last token's forward produced the
    flipped prediction, so that is the token whose routing matters.

    explained = fp32 margin < 0.5 nats (a near-tie at the output), or some MoE layer's boundary gap
    at the last token < factor x that layer's bf16 noise (a near-tie at a router's top-k, where bf16
    rounding in either implementation may pick other experts). A flip is accepted only where exact
    math itself is such a near-tie; anything else is a bug."""
    vocab = _vocab(model_dir)
    _check_tokens([tok_a, tok_b], vocab)
    r = router_gaps(model_dir, token_ids, device=device)
    margin = abs(float(r.logprobs[tok_a] - r.logprobs[tok_b]))
    ratios = [_ratio(float(g), float(n)) for g, n in zip(r.gaps[-1], r.noise)]
    i = min(range(len(ratios)), key=ratios.__getitem__)
    return FlipExplanation(margin=margin, ratio=ratios[i], layer=r.layers[i], gap=float(r.gaps[-1, i]),
                           noise=float(r.noise[i]),
                           explained=margin < ORACLE_MARGIN or ratios[i] < factor or ratios[i] == 0.0)


def diagnose_spikes(ref_result: dict, comparison, device: str = "cpu") -> List[str]:
    """One line per spike flip of a compare.Comparison (report only; no verdict yet): the oracle's
    explanation, and the fp32 margin after swapping the tightest router's boundary expert at that
    token. ref_result: the reference run's JSON (tests/e2e/generate.py: its model and prompts)."""
    model, prompts = ref_result.get("model"), ref_result.get("prompts")
    if not model or prompts is None:
        raise ValueError("the reference run has no model/prompts (generate.py predates the oracle)")
    lines = []
    for (p, i), (before, rt, tt) in sorted(comparison.spike_cases.items()):
        ids = list(prompts[p]) + list(before)
        e = explain_flip(model, ids, rt, tt, device=device)
        swapped = swapped_margin(model, ids, rt, tt, e.layer, device=device)
        lines.append(f"prompt {p} pos {i} ({rt} vs {tt}): {e}; with layer {e.layer}'s boundary expert swapped "
                     f"the fp32 margin is {swapped:+.3f}")
    return lines


def main(argv) -> int:
    if len(argv) != 4:
        print(__doc__)
        return 2
    with open(argv[1]) as f:
        ids = json.load(f)
    e = explain_flip(argv[0], ids, int(argv[2]), int(argv[3]))
    print(e)
    return 0 if e.explained else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
