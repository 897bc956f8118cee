"""Tiny checkpoints in the Hub layout transformers' own model writes, for architectures whose layers are too many and
too new to spell out by hand (Qwen3.8-Flash-Next's hyper-connections and n-gram tables, GLM-5.3's KDA, mHC and sparse
MLA): transformers builds the model from the tiny config and saves it, which gives every tensor's name and shape as a
release holds them (one tensor per expert) and the index buffers it derives from the config; `tiny_values` then gives
the tensors the values every tiny checkpoint has."""
from __future__ import annotations

import tempfile
from typing import Callable, Dict

import torch


def saved_tensors(model_cls: str, config_cls: str, config: dict, conversion_of: str = "",
                  **overrides) -> Dict[str, torch.Tensor]:
    """{name: tensor} as transformers' `model_cls` (built from `config` read by `config_cls`) saves them, with
    transformers' initial values; the same files every time (its initialisation runs under a fixed seed).
    `conversion_of`: the model_type whose checkpoint conversion the text model's save reverses where the installed
    transformers has none under the text config's own model_type (see use_family_conversion)."""
    import transformers
    from safetensors.torch import load_file
    skip = ("model_type", "architectures", "dtype", "torch_dtype")
    cfg = getattr(transformers, config_cls)(**{k: v for k, v in config.items() if k not in skip}, **overrides)
    if conversion_of:
        use_family_conversion(cfg.model_type, conversion_of)
    with tempfile.TemporaryDirectory() as d, torch.random.fork_rng():
        torch.manual_seed(0)
        getattr(transformers, model_cls)(cfg).save_pretrained(d)
        return load_file(f"{d}/model.safetensors")


def use_family_conversion(model_type: str, family: str) -> None:
    """Let transformers save `model_type` with `family`'s checkpoint conversion when it has none of its own.

    save_pretrained writes the Hub layout (one tensor per expert, the release's names) by reversing the conversion it
    finds under the model's model_type. transformers 5.17 (the GPU machine's) lists GLM-5.3's under "glm5_next" only,
    not under its text config's "glm5_next_text" (5.20 lists both): its save kept the fused in-memory layout
    (`experts.down_proj` of shape (E, H, I), one conv1d for q/k/v), which no release holds and vLLM cannot load."""
    import transformers
    from transformers import conversion_mapping as cm
    if cm.get_checkpoint_conversion_mapping(model_type) is not None:
        return
    family_mapping = cm.get_checkpoint_conversion_mapping(family)
    if family_mapping is None:
        raise ValueError(f"transformers {transformers.__version__} has no checkpoint conversion for {model_type} or "
                         f"{family}: its save would not write the Hub layout")
    cm.register_checkpoint_conversion_mapping(model_type, family_mapping)


def tiny_values(tensors: Dict[str, torch.Tensor], w, keep: Callable[[str], bool]) -> None:
    """`tensors` into `w` (tiny_checkpoint's _Weights) as bf16 with the tiny checkpoints' values: projections,
    experts and routers N(0, 1/fan_in), the output head at a gain of 3, embeddings (and n-gram tables) N(0, 1),
    convolutions N(0, 1/width); integer buffers, vectors (norms, biases, decay parameters) and what `keep` names
    (residual-stream mixers: a random mixer of unit gain would grow the streams layer after layer) as transformers
    initialised them."""
    for name, t in sorted(tensors.items()):
        if not t.is_floating_point():
            w.t[name] = t
            continue
        if t.dim() == 1 or keep(name):
            v = t
        elif name.endswith("embed_tokens.weight") or ".ngram_embedding." in name:
            v = torch.randn(t.shape, generator=w.g)
        elif name.endswith("conv1d.weight"):
            v = torch.randn(t.shape, generator=w.g) / t.shape[-1] ** 0.5
        elif t.dim() == 2:
            v = torch.randn(t.shape, generator=w.g) * ((3.0 if name.endswith("lm_head.weight") else 1.0) / t.shape[1] ** 0.5)
        else:
            raise ValueError(f"tiny checkpoint: no rule for {name} {tuple(t.shape)}")
        w.t[name] = v.to(torch.bfloat16)


def fresh_like(t: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """A tensor of t's shape and dtype with fresh values at t's scale (an MTP layer shaped like a target layer): a
    matrix N(0, std of t), a vector (a norm, a gain, a bias) as t."""
    if t.dim() < 2:
        return t.clone()
    return (torch.randn(t.shape, generator=g) * t.float().std()).to(t.dtype)


def fresh_copy(target: Dict[str, torch.Tensor], src: str, dst: str, g: torch.Generator,
               skip: Callable[[str], bool] = lambda name: False) -> Dict[str, torch.Tensor]:
    """The target's tensors under prefix `src` (but those `skip` names) renamed to `dst`, each fresh_like its twin."""
    return {dst + n[len(src):]: fresh_like(t, g) for n, t in target.items() if n.startswith(src) and not skip(n)}


def under_text_prefix(tensors: Dict[str, torch.Tensor], text: str = "model.language_model.") -> Dict[str, torch.Tensor]:
    """A text model's tensors as a vision-language release keeps them: model.* under `text`, the rest (lm_head, mtp.*)
    as they are."""
    return {(text + k[len("model."):] if k.startswith("model.") else k): t for k, t in tensors.items()}
