"""Qwen3.8-Flash-Next in its vision-language layout for lvllm.testing.tiny_checkpoint: vLLM 0.33.0's
Qwen4ExpForConditionalGeneration (model_type qwen4_exp: a Qwen3-VL vision tower beside lvllm.testing.qwen4_exp's text
model) with the text model under text_config and its tensors under model.language_model. (vLLM maps them to
language_model.model.), the lm_head at the top, as transformers' own Qwen4ExpForConditionalGeneration saves them.
The vision tower is described (vision_config: transformers' Qwen4ExpVisionConfig) but its weights are not written:
serve these checkpoints with --language-model-only (tiny_checkpoint.LANGUAGE_MODEL_ONLY), as a text-only deployment
does. The image / video / vision start and end token ids are the tokenizer's vision tokens
(tiny_checkpoint.VISION_SPECIAL), inside the tiny vocabulary.

big: qwen4_exp's release shape with transformers' vision defaults; config only (--load-format dummy). tiny: qwen4_exp's
tiny text model and bf16 weights, renamed."""
from __future__ import annotations

from . import qwen4_exp
from .hub_layout import under_text_prefix

VISION = {"tiny": dict(depth=1, hidden_size=64, num_heads=2, intermediate_size=128, num_position_embeddings=64),
          "big": dict(depth=27, hidden_size=1152, num_heads=16, intermediate_size=4304, num_position_embeddings=2304)}
SHAPES = {size: dict(s, vision=VISION[size]) for size, s in qwen4_exp.SHAPES.items()}
# The tokenizer's vision tokens (Qwen3-VL's), in the order of TOKEN_ID_FIELDS
VISION_TOKENS = ["<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>"]
TOKEN_ID_FIELDS = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
TEXT = "model.language_model."  # where this layout keeps the text model's "model." part


def config(s: dict, vocab: int) -> dict:
    """The top-level config; the vision token ids right after the tokenizer's special tokens."""
    from .tiny_checkpoint import SPECIAL
    text = dict(qwen4_exp.config(s, vocab), architectures=None)
    vision = dict(model_type="qwen4_exp_vision", hidden_act="gelu_pytorch_tanh", in_channels=3, patch_size=16,
                  spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=s["H"], initializer_range=0.02,
                  **s["vision"])
    ids = {field: len(SPECIAL) + i for i, field in enumerate(TOKEN_ID_FIELDS)}
    return dict(architectures=["Qwen4ExpForConditionalGeneration"], model_type="qwen4_exp", text_config=text,
                vision_config=vision, tie_word_embeddings=False, torch_dtype="bfloat16", **ids)


def weights(s: dict, vocab: int, w) -> None:
    """qwen4_exp's tiny text model and lm_head (the same values), under this layout's names."""
    qwen4_exp.weights(s, vocab, w)
    w.t = under_text_prefix(w.t, TEXT)
