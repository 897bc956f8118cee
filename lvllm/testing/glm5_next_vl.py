"""GLM-5.3-Flash as released for lvllm.testing.tiny_checkpoint: the vision-language architecture
(Glm5NextForConditionalGeneration, model_type glm5_next) with the text model of lvllm.testing.glm5_next under
text_config and its tensors under model.language_model. (vLLM 0.33.0 maps them to language_model.model.; its MTP
loader strips the same prefix), the lm_head at the top. The vision tower is described (vision_config) but its weights
are not written: serve these checkpoints with --language-model-only (tiny_checkpoint.LANGUAGE_MODEL_ONLY), as a
text-only deployment of the release does. The image / video token ids are the tokenizer's vision tokens
(tiny_checkpoint.VISION_SPECIAL), inside the tiny vocabulary.

big: the released text shape (glm5_next's) with transformers' Glm5NextVisionConfig defaults; config only (serve it
with --load-format dummy). tiny: glm5_next's tiny text model and bf16 weights, renamed."""
from __future__ import annotations

from . import glm5_next
from .hub_layout import under_text_prefix

VISION = {"tiny": dict(depth=1, hidden_size=64, num_heads=2, intermediate_size=128, out_hidden_size=128,
                       projection_intermediate_size=256),
          "big": dict(depth=24, hidden_size=1024, num_heads=16, intermediate_size=4096, out_hidden_size=1536,
                      projection_intermediate_size=10240)}
SHAPES = {size: dict(s, vision=VISION[size]) for size, s in glm5_next.SHAPES.items()}
# The release's names of its vision tokens, in the order of the config's token-id fields below
VISION_TOKENS = ["<|image|>", "<|video|>", "<|begin_of_image|>", "<|end_of_image|>", "<|begin_of_video|>",
                 "<|end_of_video|>"]
TOKEN_ID_FIELDS = ("image_token_id", "video_token_id", "image_start_token_id", "image_end_token_id",
                   "video_start_token_id", "video_end_token_id")
TEXT = "model.language_model."  # where the release keeps the text model's "model." part


def config(s: dict, vocab: int) -> dict:
    """The release's top-level config; the vision token ids are the tokenizer's VISION_TOKENS (right after its
    special tokens)."""
    from .tiny_checkpoint import SPECIAL
    first_vision_id = len(SPECIAL)
    text = dict(glm5_next.config(s, vocab), architectures=None)
    vision = dict(model_type="glm5_next_vision", in_channels=3, patch_size=14, temporal_patch_size=2,
                  spatial_merge_size=2, hidden_act="silu", rms_norm_eps=1e-5, swiglu_limit=10.0, **s["vision"])
    ids = {field: first_vision_id + i for i, field in enumerate(TOKEN_ID_FIELDS)}
    return dict(architectures=["Glm5NextForConditionalGeneration"], model_type="glm5_next", text_config=text,
                vision_config=vision, tie_word_embeddings=False, torch_dtype="bfloat16", **ids)


def weights(s: dict, vocab: int, w) -> None:
    """glm5_next's tiny text model and lm_head (the same values), under the release's names."""
    glm5_next.weights(s, vocab, w)
    w.t = under_text_prefix(w.t, TEXT)


def mtp_weights(s: dict, w, n: int, target: dict) -> None:
    """glm5_next's MTP layers (after the decoder layers) under the release's names."""
    text_target = {"model." + k[len(TEXT):] if k.startswith(TEXT) else k: t for k, t in target.items()}
    glm5_next.mtp_weights(s, w, n, text_target)
    w.t = under_text_prefix(w.t, TEXT)
