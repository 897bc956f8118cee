#!/usr/bin/env python3
"""Write a small checkpoint of a real MoE architecture: config.json that vLLM 0.33.0 loads as it
is, safetensors with random weights under the names the Hub checkpoints of that family use, and
a small byte-level BPE tokenizer with a chat template (so `vllm serve` works with text).

    python tools/make_tiny_checkpoint.py --arch qwen3_moe --out /tmp/tiny-qwen3
    python tools/make_tiny_checkpoint.py --arch qwen3_moe --size big --out /tmp/q30b   # config only:
        # Qwen3-30B-A3B's shape, for `vllm serve ... --load-format dummy` benchmarks

Architectures: qwen3_moe, deepseek_v3, glm4_moe, mixtral, minimax_m2, qwen3_next, glm_moe_dsa, qwen3_5_moe,
qwen3_5_moe_vl (Qwen3.5-MoE as released: the text model and a vision tower; bf16 only), deepseek_v4 (bf16, or its
routed experts as mxfp4 as released, fp8 or nvfp4: lvllm.testing.deepseek_v4.RELEASE_FORMATS),
deepseek_v41 (tiny with weights; big and with DSpark stages config only: --load-format dummy), kimi_k25 (Kimi-K2.5 /
K2.6 as released: DeepSeek-V3's text model under language_model. beside a MoonViT vision tower; bf16, or w4a16: its
int4 experts as released), kimi_k3 (Kimi-K3 as released: KimiLinear's text model under language_model. beside a
MoonViT vision tower; tiny with weights, big and --mtp config only; bf16, or mxfp4_ct: its compressed-tensors MXFP4
experts as released), minimax_m3 (MiniMax-M3 as released: its text model under language_model., the vision tower in
the config only: serve it with --language-model-only), glm5_next_vl (GLM-5.3-Flash as released: glm5_next's text
model under model.language_model., the vision tower in the config only, --language-model-only), qwen4_exp_vl
(Qwen3.8-Flash-Next's vision-language layout: qwen4_exp's text model under model.language_model., the vision tower
in the config only, --language-model-only), qwen4_exp (Qwen3.8-Flash-Next) and glm5_next (GLM-5.3's text model)
(tiny with bf16 weights; big config only, glm5_next's also in its release's block fp8) (bf16; --quant fp8, w4a16,
nvfp4, fp8_channel, int8_channel or mxfp4_ct for the quantized layouts) and gpt_oss (MXFP4 experts with biases, as
released; the layout was checked against transformers' own MXFP4 dequantization).

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

from . import deepseek_v4, deepseek_v41, glm5_next, glm5_next_vl, kimi_k3, minimax_m3, qwen4_exp, qwen4_exp_vl
from .checkpoint_quant import QUANTS, ct_mxfp4_config, quantize_checkpoint
from .quantizers import quantize_mxfp4

ARCHS = ("qwen3_moe", "deepseek_v3", "glm4_moe", "mixtral", "gpt_oss", "minimax_m2", "qwen3_next", "glm_moe_dsa",
         "qwen3_5_moe", "qwen3_5_moe_vl", "deepseek_v4", "deepseek_v41", "kimi_k25", "kimi_k3", "minimax_m3",
         "glm5_next", "glm5_next_vl", "qwen4_exp", "qwen4_exp_vl")
# Architectures with their own module for config and shapes; those without a `weights` writer there (CONFIG_ONLY)
# are written as config + tokenizer only (serve with --load-format dummy)
CONFIG_MODULES = {"deepseek_v41": deepseek_v41, "kimi_k3": kimi_k3, "minimax_m3": minimax_m3, "glm5_next": glm5_next,
                  "glm5_next_vl": glm5_next_vl, "qwen4_exp": qwen4_exp, "qwen4_exp_vl": qwen4_exp_vl}
CONFIG_ONLY = tuple(a for a, m in CONFIG_MODULES.items() if not hasattr(m, "weights"))
# Vision-language releases: the text model's weights under model.language_model., a vision tower beside it.
VL_TEXT = {"qwen3_5_moe_vl": "qwen3_5_moe", "kimi_k25": "deepseek_v3"}
# Where each release keeps its text model's "model." part, and its lm_head
TEXT_PREFIX = {"qwen3_5_moe_vl": ("model.language_model", "lm_head"),
               "kimi_k25": ("language_model.model", "language_model.lm_head"),
               "kimi_k3": (f"{kimi_k3.TEXT}model", f"{kimi_k3.TEXT}lm_head"),
               "minimax_m3": (f"{minimax_m3.TEXT}model", f"{minimax_m3.TEXT}lm_head"),
               "glm5_next_vl": (glm5_next_vl.TEXT.rstrip("."), "lm_head"),
               "qwen4_exp_vl": (qwen4_exp_vl.TEXT.rstrip("."), "lm_head")}
# Their tokenizer's vision tokens (ids right after SPECIAL's) and image / video processor settings.
# Qwen3-VL's: image, video, vision start, vision end; 16-pixel patches, 2 frames, 2 x 2 merge, mean = std = 0.5.
VISION_SPECIAL = {"qwen3_5_moe_vl": ["<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>"],
                  "kimi_k3": [kimi_k3.IMAGE_PLACEHOLDER], "glm5_next_vl": glm5_next_vl.VISION_TOKENS,
                  "qwen4_exp_vl": qwen4_exp_vl.VISION_TOKENS,
                  # Kimi-K2.5's media tokens (vLLM's image placeholder is begin, content, pad, end)
                  "kimi_k25": ["<|media_begin|>", "<|media_content|>", "<|media_end|>", "<|media_pad|>",
                               "<|kimi_k25_video_placeholder|>"]}
_PIXELS = dict(patch_size=16, temporal_patch_size=2, merge_size=2, image_mean=[0.5, 0.5, 0.5],
               image_std=[0.5, 0.5, 0.5], size={"shortest_edge": 4096, "longest_edge": 1048576})
# Kimi-K2.5: 14-pixel patches, 2 x 2 merge, 4 frames a video chunk. One preprocessor_config.json serves vLLM's
# fused processor (its media_proc_cfg block; patch limits kept small so its startup profile image is small)
# and transformers' Kimi_K25ImageProcessor (the top-level keys).
_KIMI_MEDIA = {"in_patch_limit": 1024, "patch_size": 14, "image_mean": [0.5] * 3, "image_std": [0.5] * 3,
               "merge_kernel_size": 2, "fixed_output_tokens": None, "patch_limit_on_one_side": 64,
               "in_patch_limit_each_frame": 1024, "in_patch_limit_video": None, "sample_fps": 2.0,
               "max_num_frames_each_video": None, "temporal_merge_kernel_size": 4, "timestamp_mode": "hh:mm:ss.fff",
               "config_type": "media_proc.processors.moonvit.MoonViTMediaProcessorConfig"}
VL_PROCESSOR_FILES = {
    "qwen3_5_moe_vl": {
        "preprocessor_config.json": dict(_PIXELS, image_processor_type="Qwen2VLImageProcessor",
                                         processor_class="Qwen3VLProcessor"),
        "video_preprocessor_config.json": dict(_PIXELS, video_processor_type="Qwen3VLVideoProcessor",
                                               processor_class="Qwen3VLProcessor", fps=2, min_frames=4, max_frames=16),
    },
    "kimi_k25": {
        "preprocessor_config.json": dict(media_proc_cfg=_KIMI_MEDIA, image_processor_type="Kimi_K25ImageProcessor",
                                         patch_size=14, merge_size=2, max_patches=1024,
                                         size={"max_height": 64, "max_width": 64}, image_mean=[0.5] * 3,
                                         image_std=[0.5] * 3),
    },
}
VL_PROCESSOR_FILES["kimi_k3"] = VL_PROCESSOR_FILES["kimi_k25"]  # K3's processor is K2.5's fused MoonViT one
# Vision-language releases written without their vision tower's weights: served with --language-model-only (vLLM
# skips the tower, as a text-only deployment of the release does)
LANGUAGE_MODEL_ONLY = ("minimax_m3", "glm5_next_vl", "qwen4_exp_vl")
# Mixtral-style routed experts: block_sparse_moe.experts.N.{w1 (gate), w3 (up), w2 (down)}
BLOCK_SPARSE = ("mixtral", "minimax_m2", "minimax_m3", "kimi_k3")

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
    # GLM-5 (GlmMoeDsaForCausalLM): DeepSeek-V3's MLA and MoE plus DSA, a lightning indexer per layer that
    # picks the index_topk keys each query attends to; big: zai-org/GLM-5's shape (transformers' defaults).
    "glm_moe_dsa": {
        "tiny": dict(H=512, L=4, nh=16, E=16, K=4, I=256, dense_I=1024, V=2048, q_lora=256, kv_lora=512,
                     nope=128, rope=64, v=128, shared=1, dense=1, idx_heads=32, idx_dim=128, idx_topk=2048),
        "big": dict(H=6144, L=78, nh=64, E=256, K=8, I=2048, dense_I=12288, V=154880, q_lora=2048, kv_lora=512,
                    nope=192, rope=64, v=256, shared=1, dense=3, idx_heads=32, idx_dim=128, idx_topk=2048,
                    ctx=202752),
    },
    # DeepSeek-V4: the inference release's names (layers.N.attn.wq_a, ffn.experts.E.w1, embed, head), mHC
    # residual streams (hc_mult copies, fp32 mixing weights), a single 512-wide KV head with a compressor
    # per layer (sliding window only / CSA: 4 tokens per entry, overlapping, with a lightning indexer /
    # HCA: 128 per entry), grouped low-rank output, hash-routed first MoE layers (a token -> experts table),
    # sqrtsoftplus routing with a selection bias after them, a shared expert, clamped SwiGLU experts.
    # vLLM's compressor needs head_dim 512 (the indexer's: 128); its Hopper indexer kernels need the release's
    # 64 indexer heads (4 failed in stock vLLM on the H200: "weights.strides[0] ... expected to be divisible
    # by 8") and a top-k that FlashMLA's 64/128-wide tiles divide. big: deepseek-ai/DeepSeek-V4-Flash-Base
    # (transformers' defaults of DeepseekV4Config).
    "deepseek_v4": {
        "tiny": dict(H=256, L=4, nh=4, hd=512, q_lora=128, o_groups=2, o_lora=64, E=16, K=4, I=128, V=2048,
                     idx_heads=64, idx_dim=128, idx_topk=128, hc=4, hash_layers=1, swiglu_limit=10.0,
                     layer_types=["sliding_attention", "heavily_compressed_attention", "compressed_sparse_attention",
                                  "compressed_sparse_attention"]),
        "big": dict(H=4096, L=43, nh=64, hd=512, q_lora=1024, o_groups=8, o_lora=1024, E=256, K=6, I=2048,
                    V=129280, idx_heads=64, idx_dim=128, idx_topk=512, hc=4, hash_layers=3, swiglu_limit=10.0,
                    layer_types=None, ctx=1048576),
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
    # MiniMax-M2: sigmoid routing with a selection bias, q/k RMSNorm over all heads, partial RoPE
    # (rotary_dim), no shared experts, every layer MoE; big: MiniMaxAI/MiniMax-M2's config.json.
    "minimax_m2": {
        "tiny": dict(H=512, L=4, nh=8, nkv=4, hd=64, E=16, K=4, I=256, V=2048, rot=32),
        "big": dict(H=3072, L=62, nh=48, nkv=8, hd=128, E=256, K=8, I=1536, V=200064, rot=64, ctx=196608),
    },
    # Qwen3-Next: Gated DeltaNet linear attention in 3 of every 4 layers (full attention with an output gate
    # in the 4th: several KV-cache groups), a shared expert behind a sigmoid gate in every MoE layer,
    # zero-centred RMSNorms (weight 0 = scale 1); big: Qwen/Qwen3-Next-80B-A3B-Instruct's config.json.
    # GDN heads of 128 as released: FlashInfer's SM90 chunked delta rule (vLLM's prefill path on Hopper)
    # takes no other head size (64 failed there: "DSL kernel only supports D=128").
    "qwen3_next": {
        "tiny": dict(H=512, L=4, nh=8, nkv=2, hd=64, E=16, K=4, I=256, shared_I=256, dense_I=1024, V=2048,
                     lin_nk=2, lin_nv=4, lin_dk=128, lin_dv=128, conv=4, every=4),
        "big": dict(H=2048, L=48, nh=16, nkv=2, hd=256, E=512, K=10, I=512, shared_I=512, dense_I=5120, V=151936,
                    lin_nk=16, lin_nv=32, lin_dk=128, lin_dv=128, conv=4, every=4, ctx=262144),
    },
    # Qwen3.5-MoE (text model): Qwen3-Next's layers with the GDN input projections split as released
    # (in_proj_qkv, in_proj_z, in_proj_b, in_proj_a); big: Qwen/Qwen3.5-35B-A3B (transformers' defaults
    # of Qwen3_5MoeTextConfig).
    "qwen3_5_moe": {
        "tiny": dict(H=512, L=4, nh=8, nkv=2, hd=64, E=16, K=4, I=256, shared_I=256, dense_I=1024, V=2048,
                     lin_nk=2, lin_nv=4, lin_dk=128, lin_dv=128, conv=4, every=4),
        "big": dict(H=2048, L=40, nh=16, nkv=2, hd=256, E=256, K=8, I=512, shared_I=512, dense_I=5120, V=248320,
                    lin_nk=16, lin_nv=32, lin_dk=128, lin_dv=128, conv=4, every=4, ctx=262144),
    },
    # vision tower: patch 16 x 16 x 2 frames, 2 x 2 merge; big: transformers' Qwen3_5MoeVisionConfig defaults
    "qwen3_5_moe_vl": {
        "tiny": dict(vis_depth=1, vis_H=64, vis_I=128, vis_heads=2, vis_pos=64),
        "big": dict(vis_depth=27, vis_H=1152, vis_I=4304, vis_heads=16, vis_pos=2304),
    },
    # Kimi-K2.5 / K2.6: DeepSeek-V3's text model beside a MoonViT 3-D vision tower (transformers'
    # Kimi_K25VisionConfig defaults for big); vis_pos: the learned position grid's side. big: Kimi-K2's text shape
    # over DeepSeek-V3's (384 experts, 64 heads, one dense layer, one routing group, its vocabulary and routed scaling)
    "kimi_k25": {
        "tiny": dict(vis_depth=1, vis_H=64, vis_I=128, vis_heads=2, vis_pos=8),
        "big": dict(vis_depth=27, vis_H=1152, vis_I=4304, vis_heads=16, vis_pos=64, E=384, nh=64, dense=1, groups=1,
                    topk_groups=1, V=163840, route_scale=2.827),
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
                    routed_scaling_factor=s.get("route_scale", 2.5), n_group=s["groups"], topk_group=s["topk_groups"],
                    topk_method="noaux_tc", scoring_func="sigmoid", norm_topk_prob=True, moe_layer_freq=1,
                    first_k_dense_replace=s["dense"], q_lora_rank=s["q_lora"], kv_lora_rank=s["kv_lora"],
                    qk_nope_head_dim=s["nope"], qk_rope_head_dim=s["rope"], v_head_dim=s["v"],
                    rope_theta=10000.0, rope_scaling=None, attention_bias=False, num_nextn_predict_layers=0)
    if arch == "glm_moe_dsa":
        return dict(common, architectures=["GlmMoeDsaForCausalLM"], model_type="glm_moe_dsa",
                    num_key_value_heads=s["nh"], intermediate_size=s["dense_I"], moe_intermediate_size=s["I"],
                    n_routed_experts=s["E"], n_shared_experts=s["shared"], num_experts_per_tok=s["K"],
                    routed_scaling_factor=2.5, n_group=1, topk_group=1, topk_method="noaux_tc",
                    scoring_func="sigmoid", norm_topk_prob=True, first_k_dense_replace=s["dense"],
                    mlp_layer_types=["dense" if i < s["dense"] else "sparse" for i in range(s["L"])],
                    q_lora_rank=s["q_lora"], kv_lora_rank=s["kv_lora"], qk_nope_head_dim=s["nope"],
                    qk_rope_head_dim=s["rope"], v_head_dim=s["v"], head_dim=s["rope"],
                    index_topk=s["idx_topk"], index_head_dim=s["idx_dim"], index_n_heads=s["idx_heads"],
                    rope_theta=1000000.0, attention_bias=False, rms_norm_eps=1e-5, num_nextn_predict_layers=0)
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
    if arch == "minimax_m2":
        return dict(common, architectures=["MiniMaxM2ForCausalLM"], model_type="minimax_m2",
                    num_key_value_heads=s["nkv"], head_dim=s["hd"], intermediate_size=s["I"],
                    num_local_experts=s["E"], num_experts_per_tok=s["K"], scoring_func="sigmoid",
                    use_routing_bias=True, rotary_dim=s["rot"], rope_theta=5000000.0, qk_norm_type="per_layer",
                    use_qk_norm=True, router_aux_loss_coef=0.001)
    if arch == "qwen3_next":
        return dict(common, architectures=["Qwen3NextForCausalLM"], model_type="qwen3_next",
                    num_key_value_heads=s["nkv"], head_dim=s["hd"], intermediate_size=s["dense_I"],
                    num_experts=s["E"], num_experts_per_tok=s["K"], moe_intermediate_size=s["I"],
                    shared_expert_intermediate_size=s["shared_I"], norm_topk_prob=True, decoder_sparse_step=1,
                    mlp_only_layers=[], full_attention_interval=s["every"],
                    layer_types=["full_attention" if (i + 1) % s["every"] == 0 else "linear_attention"
                                 for i in range(s["L"])],
                    linear_conv_kernel_dim=s["conv"], linear_key_head_dim=s["lin_dk"],
                    linear_value_head_dim=s["lin_dv"], linear_num_key_heads=s["lin_nk"],
                    linear_num_value_heads=s["lin_nv"], partial_rotary_factor=0.25, rope_theta=10000000.0,
                    attention_bias=False, attention_dropout=0.0, router_aux_loss_coef=0.001)
    if arch == "qwen3_5_moe":
        return dict(common, architectures=["Qwen3_5MoeForCausalLM"], model_type="qwen3_5_moe_text",
                    num_key_value_heads=s["nkv"], head_dim=s["hd"], num_experts=s["E"],
                    num_experts_per_tok=s["K"], moe_intermediate_size=s["I"],
                    shared_expert_intermediate_size=s["shared_I"],
                    layer_types=["full_attention" if (i + 1) % s["every"] == 0 else "linear_attention"
                                 for i in range(s["L"])],
                    linear_conv_kernel_dim=s["conv"], linear_key_head_dim=s["lin_dk"],
                    linear_value_head_dim=s["lin_dv"], linear_num_key_heads=s["lin_nk"],
                    linear_num_value_heads=s["lin_nv"],
                    rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
                    attention_bias=False, attention_dropout=0.0, router_aux_loss_coef=0.001)
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
    if arch == "deepseek_v4":
        cfg = dict(common, architectures=["DeepseekV4ForCausalLM"], model_type="deepseek_v4",
                   num_key_value_heads=1, head_dim=s["hd"], q_lora_rank=s["q_lora"], o_groups=s["o_groups"],
                   o_lora_rank=s["o_lora"], n_routed_experts=s["E"], n_shared_experts=1,
                   num_experts_per_tok=s["K"], moe_intermediate_size=s["I"], scoring_func="sqrtsoftplus",
                   topk_method="noaux_tc", norm_topk_prob=True, routed_scaling_factor=1.5,
                   swiglu_limit=s["swiglu_limit"], hc_mult=s["hc"], index_n_heads=s["idx_heads"],
                   index_head_dim=s["idx_dim"], index_topk=s["idx_topk"], sliding_window=128,
                   mlp_layer_types=["hash_moe" if i < s["hash_layers"] else "moe" for i in range(s["L"])],
                   num_nextn_predict_layers=0, rope_theta=10000.0, compress_rope_theta=160000.0)
        if s["layer_types"]:
            cfg["layer_types"] = s["layer_types"]
        return cfg
    if arch == "kimi_k25":
        return _kimi_k25_config(s, vocab)
    if arch in VL_TEXT:
        text = dict(_config(VL_TEXT[arch], s, vocab), architectures=None)
        vision = dict(model_type="qwen3_5_moe_vision", depth=s["vis_depth"], hidden_size=s["vis_H"],
                      intermediate_size=s["vis_I"], num_heads=s["vis_heads"], hidden_act="gelu_pytorch_tanh",
                      in_channels=3, patch_size=16, temporal_patch_size=2, spatial_merge_size=2,
                      out_hidden_size=s["H"], num_position_embeddings=s["vis_pos"], initializer_range=0.02)
        ids = {f"{name}_token_id": len(SPECIAL) + i for i, name in enumerate(("image", "video", "vision_start",
                                                                            "vision_end"))}
        return dict(architectures=["Qwen3_5MoeForConditionalGeneration"], model_type="qwen3_5_moe",
                    text_config=text, vision_config=vision, tie_word_embeddings=False, torch_dtype="bfloat16", **ids)
    raise ValueError(f"unknown architecture {arch!r}; choose from {', '.join(ARCHS)}")


def _kimi_k25_config(s: dict, vocab: int) -> dict:
    """transformers' Kimi_K25Config field names (vLLM 0.33 reads the same class; the Hub's remote-code names,
    vt_* / init_pos_emb_*, are read by neither), the media token ids of this tokenizer, no tied embeddings
    (vLLM's DeepSeek-V3 text model never ties them)."""
    text = _config("deepseek_v3", s, vocab)
    text.pop("architectures")
    text.update(model_type="kimi_k2", tie_word_embeddings=False)  # kimi_k2: the release's text model type
    ids = {t: len(SPECIAL) + i for i, t in enumerate(VISION_SPECIAL["kimi_k25"])}
    vision = dict(patch_size=14, pos_emb_height=s["vis_pos"], pos_emb_width=s["vis_pos"], pos_emb_time=4,
                  num_attention_heads=s["vis_heads"], num_hidden_layers=s["vis_depth"], hidden_size=s["vis_H"],
                  intermediate_size=s["vis_I"], hidden_act="gelu_pytorch_tanh", merge_kernel_size=[2, 2],
                  merge_type="sd2_tpool", pos_emb_type="divided_fixed", mm_projector_type="patchmerger",
                  video_attn_type="spatial_temporal")
    return dict(architectures=["KimiK25ForConditionalGeneration"], model_type="kimi_k25", text_config=text,
                vision_config=vision, projection_hidden_size=s["vis_H"], projection_layer_norm_eps=1e-5,
                image_token_id=ids["<|media_pad|>"], video_token_id=ids["<|kimi_k25_video_placeholder|>"],
                vision_start_token_id=ids["<|media_begin|>"], vision_end_token_id=ids["<|media_end|>"],
                media_placeholder_token_id=ids["<|media_pad|>"], use_unified_vision_chunk=True,
                video_placeholder="<|kimi_k25_video_placeholder|>", tie_word_embeddings=False, torch_dtype="bfloat16")


def _kimi_vision_tower(s: dict, w: "_Weights") -> None:
    """Kimi-K2.5's MoonViT under vision_tower. and its projector (the Hub's names: fused wqkv, norm0/1,
    mlp.fc0/1, a 2-D learned position grid, a 2 x 2 merge into mm_projector.proj.0/2)."""
    Hv, v = s["vis_H"], "vision_tower"
    w.t[f"{v}.patch_embed.proj.weight"] = (torch.randn(Hv, 3, 14, 14, generator=w.g) / math.sqrt(3 * 14 * 14)
                                           ).to(torch.bfloat16)
    w.t[f"{v}.patch_embed.proj.bias"] = torch.zeros(Hv, dtype=torch.bfloat16)
    w.t[f"{v}.patch_embed.pos_emb.weight"] = (0.1 * torch.randn(s["vis_pos"], s["vis_pos"], Hv, generator=w.g)
                                              ).to(torch.bfloat16)
    _vit_blocks(s, w, f"{v}.encoder.blocks", ("norm0", "norm1", "wqkv", "wo", "mlp.fc0", "mlp.fc1"))
    w.layer_norm(f"{v}.encoder.final_layernorm", Hv)
    w.layer_norm("mm_projector.pre_norm", Hv)
    w.linear("mm_projector.proj.0", 4 * Hv, 4 * Hv, bias=True)
    w.linear("mm_projector.proj.2", s["H"], 4 * Hv, bias=True)


def _vit_blocks(s: dict, w: "_Weights", prefix: str, names: tuple) -> None:
    """Pre-norm ViT blocks with biases: names = (first norm, second norm, fused qkv, output projection,
    MLP in, MLP out) under prefix.N."""
    Hv = s["vis_H"]
    norm_a, norm_b, qkv, proj, fc1, fc2 = names
    for i in range(s["vis_depth"]):
        b = f"{prefix}.{i}"
        w.layer_norm(f"{b}.{norm_a}", Hv)
        w.layer_norm(f"{b}.{norm_b}", Hv)
        w.linear(f"{b}.{qkv}", 3 * Hv, Hv, bias=True)
        w.linear(f"{b}.{proj}", Hv, Hv, bias=True)
        w.linear(f"{b}.{fc1}", s["vis_I"], Hv, bias=True)
        w.linear(f"{b}.{fc2}", Hv, s["vis_I"], bias=True)


# Families released in block FP8 (Qwen3-Next-80B-A3B-*-FP8, Qwen3.5's -FP8 releases, MiniMax-M2 as released): "big"
# with quant "fp8" writes the release's quantization config over dummy weights
# GLM-5.3-Flash (zai-org) ships block FP8 too: routed, shared and MTP experts and the MLPs at 128 x 128, dynamic
# activations; vLLM 0.33.0's GLM-5.3 model itself builds the KDA and MLA projections unquantized (the release keeps
# them in bf16), so the config needs no list of its own
FP8_RELEASES = ("qwen3_next", "qwen3_5_moe", "minimax_m2", "glm5_next")


def fp8_release_config(config: dict) -> dict:
    """The block-FP8 quantization config of an FP8 release (128 x 128 blocks, dynamic activations): every projection
    FP8 but the Gated-DeltaNet layers' in_proj_ba (its 2 x value heads of outputs is no multiple of a block; vLLM's
    GDN layer takes it unquantized and the releases list it); routers and the shared-expert gate are unquantized
    layers in vLLM whatever the config says."""
    gdn = "linear_num_value_heads" in config  # Qwen3-Next / Qwen3.5's linear attention (GLM-5.3's KDA has none)
    keep = [f"model.layers.{i}.linear_attn.in_proj_ba" for i, t in enumerate(config.get("layer_types") or ())
            if gdn and t == "linear_attention"]
    return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128],
            "modules_to_not_convert": keep}


def _vision_tower(s: dict, w: "_Weights") -> None:
    """Qwen3.5's vision tower under model.visual. (its Hub names): a 3-D patch embedding, learned
    positions, pre-norm blocks (fused qkv), a 2 x 2 patch merger into the text model's width."""
    Hv, merged = s["vis_H"], s["vis_H"] * 4
    v = "model.visual"
    w.t[f"{v}.patch_embed.proj.weight"] = (torch.randn(Hv, 3, 2, 16, 16, generator=w.g) / math.sqrt(3 * 2 * 16 * 16)
                                           ).to(torch.bfloat16)
    w.t[f"{v}.patch_embed.proj.bias"] = torch.zeros(Hv, dtype=torch.bfloat16)
    w.t[f"{v}.pos_embed.weight"] = (0.02 * torch.randn(s["vis_pos"], Hv, generator=w.g)).to(torch.bfloat16)
    _vit_blocks(s, w, f"{v}.blocks", ("norm1", "norm2", "attn.qkv", "attn.proj", "mlp.linear_fc1", "mlp.linear_fc2"))
    w.layer_norm(f"{v}.merger.norm", Hv)
    w.linear(f"{v}.merger.linear_fc1", merged, merged, bias=True)
    w.linear(f"{v}.merger.linear_fc2", s["H"], merged, bias=True)


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

    def layer_norm(self, name: str, n: int) -> None:
        self.norm(name, n)
        self.t[f"{name}.bias"] = torch.zeros(n, dtype=torch.bfloat16)

    def mlp(self, prefix: str, H: int, I: int, names=("gate_proj", "up_proj", "down_proj")) -> None:
        self.linear(f"{prefix}.{names[0]}", I, H)
        self.linear(f"{prefix}.{names[1]}", I, H)
        self.linear(f"{prefix}.{names[2]}", H, I)


def _weights(arch: str, s: dict, vocab: int, seed: int) -> Dict[str, torch.Tensor]:
    writer = deepseek_v4 if arch == "deepseek_v4" else CONFIG_MODULES.get(arch)
    if writer is not None:  # an architecture whose module writes its own tensors
        w = _Weights(seed)
        writer.weights(s, vocab, w)
        return w.t
    if arch in VL_TEXT:
        text = _weights(VL_TEXT[arch], s, vocab, seed)
        w = _Weights(seed + 1)
        model, head = TEXT_PREFIX[arch]
        w.t = {(model + k[len("model"):] if k.startswith("model.") else
                head + k[len("lm_head"):] if k.startswith("lm_head.") else k): t for k, t in text.items()}
        (_kimi_vision_tower if arch == "kimi_k25" else _vision_tower)(s, w)
        return w.t
    w = _Weights(seed)
    H = s["H"]
    w.t["model.embed_tokens.weight"] = torch.randn(vocab, H, generator=w.g).to(torch.bfloat16)
    # Logits of std ~3: fewer near-ties between the top tokens than unit-std logits would give.
    w.linear("lm_head", vocab, H, gain=3.0)
    w.norm("model.norm", H)
    if arch == "gpt_oss":
        _gpt_oss_weights(s, vocab, w)
        return w.t
    if arch in ("qwen3_next", "qwen3_5_moe"):
        return _qwen3_next_weights(s, w, split_in_proj=arch == "qwen3_5_moe")
    for i in range(s["L"]):
        p = f"model.layers.{i}"
        w.norm(f"{p}.input_layernorm", H)
        w.norm(f"{p}.post_attention_layernorm", H)
        a = f"{p}.self_attn"
        if arch in ("deepseek_v3", "glm_moe_dsa"):
            w.linear(f"{a}.q_a_proj", s["q_lora"], H)
            w.norm(f"{a}.q_a_layernorm", s["q_lora"])
            w.linear(f"{a}.q_b_proj", s["nh"] * (s["nope"] + s["rope"]), s["q_lora"])
            w.linear(f"{a}.kv_a_proj_with_mqa", s["kv_lora"] + s["rope"], H)
            w.norm(f"{a}.kv_a_layernorm", s["kv_lora"])
            w.linear(f"{a}.kv_b_proj", s["nh"] * (s["nope"] + s["v"]), s["kv_lora"])
            w.linear(f"{a}.o_proj", H, s["nh"] * s["v"])
            if arch == "glm_moe_dsa":  # the lightning indexer: its queries from q_a, keys from the input
                x = f"{a}.indexer"
                w.linear(f"{x}.wq_b", s["idx_heads"] * s["idx_dim"], s["q_lora"])
                w.linear(f"{x}.wk", s["idx_dim"], H)
                w.norm(f"{x}.k_norm", s["idx_dim"])
                w.t[f"{x}.k_norm.bias"] = torch.zeros(s["idx_dim"], dtype=torch.bfloat16)
                w.linear(f"{x}.weights_proj", s["idx_heads"], H)
        else:
            bias = arch == "glm4_moe"
            w.linear(f"{a}.q_proj", s["nh"] * s["hd"], H, bias)
            w.linear(f"{a}.k_proj", s["nkv"] * s["hd"], H, bias)
            w.linear(f"{a}.v_proj", s["nkv"] * s["hd"], H, bias)
            w.linear(f"{a}.o_proj", H, s["nh"] * s["hd"])
            if arch == "qwen3_moe":
                w.norm(f"{a}.q_norm", s["hd"])
                w.norm(f"{a}.k_norm", s["hd"])
            if arch == "minimax_m2":  # one RMSNorm over all heads' q (and k)
                w.norm(f"{a}.q_norm", s["nh"] * s["hd"])
                w.norm(f"{a}.k_norm", s["nkv"] * s["hd"])
        if arch in ("deepseek_v3", "glm4_moe", "glm_moe_dsa") and i < s["dense"]:
            w.mlp(f"{p}.mlp", H, s["dense_I"])
            continue
        moe = f"{p}.block_sparse_moe" if arch in BLOCK_SPARSE else f"{p}.mlp"
        w.linear(f"{moe}.gate", s["E"], H)
        if arch == "minimax_m2":  # on the MoE block itself, fp32 as released
            w.t[f"{moe}.e_score_correction_bias"] = 0.01 * torch.randn(s["E"], generator=w.g)
        if arch in ("deepseek_v3", "glm4_moe", "glm_moe_dsa"):
            # Real checkpoints store the selection bias in fp32.
            w.t[f"{moe}.gate.e_score_correction_bias"] = 0.01 * torch.randn(s["E"], generator=w.g)
            w.mlp(f"{moe}.shared_experts", H, s["I"] * s["shared"])
        names = ("w1", "w3", "w2") if arch in BLOCK_SPARSE else ("gate_proj", "up_proj", "down_proj")
        for e in range(s["E"]):
            w.mlp(f"{moe}.experts.{e}", H, s["I"], names)
    return w.t


def _with_mtp_layers(tensors: Dict[str, torch.Tensor], arch: str, s: dict, vocab: int, seed: int,
                     mtp: int) -> Dict[str, torch.Tensor]:
    """DeepSeek-V3's MTP layers appended (GLM-4.5's and GLM-5's alike): the decoder layers L .. L + mtp - 1 drawn
    after the model's own (so those stay as they are) plus each MTP layer's input norms, eh_proj over [embedding;
    hidden], shared_head (its norm and a copy of lm_head) and its copy of the embedding, as released."""
    L, H = s["L"], s["H"]
    longer = _weights(arch, dict(s, L=L + mtp), vocab, seed)
    out = dict(tensors)
    w = _Weights(seed + 7)
    for i in range(L, L + mtp):
        p = f"model.layers.{i}"
        out.update((n, t) for n, t in longer.items() if n.startswith(p + "."))
        w.norm(f"{p}.enorm", H)
        w.norm(f"{p}.hnorm", H)
        w.linear(f"{p}.eh_proj", H, 2 * H)
        w.norm(f"{p}.shared_head.norm", H)
        out.update(w.t)
        out[f"{p}.shared_head.head.weight"] = tensors["lm_head.weight"].clone()
        out[f"{p}.embed_tokens.weight"] = tensors["model.embed_tokens.weight"].clone()
    return out


def _with_deepseek_v4_mtp_layers(tensors: Dict[str, torch.Tensor], s: dict, vocab: int, seed: int,
                                 mtp: int) -> Dict[str, torch.Tensor]:
    """DeepSeek-V4's MTP layers as released (vLLM's DeepSeekV4MTP reads them): mtp.<i>.*, each a decoder block
    (mHC mixing weights, attention, a sqrtsoftplus-routed MoE with a shared expert and clamped experts) whose
    attention is sliding-window only (vLLM gives a layer past the target's no compressor), its input norms enorm /
    hnorm, separate e_proj / h_proj, the final norm and its own fp32 hc_head; the embedding and head are the
    target's."""
    out = dict(tensors)
    H, hc = s["H"], s["hc"]
    for i in range(mtp):
        one = dict(s, L=1, hash_layers=0, layer_types=["sliding_attention"])
        block = _weights("deepseek_v4", one, vocab, seed + 7 + i)
        out.update((f"mtp.{i}." + n[len("layers.0."):], t) for n, t in block.items() if n.startswith("layers.0."))
        p, w = f"mtp.{i}", _Weights(seed + 17 + i)
        for norm in ("enorm", "hnorm", "norm"):
            w.norm(f"{p}.{norm}", H)
        w.linear(f"{p}.e_proj", H, H)
        w.linear(f"{p}.h_proj", H, H)
        w.t[f"{p}.hc_head_fn"] = 0.02 * torch.randn(hc, hc * H, generator=w.g)
        w.t[f"{p}.hc_head_base"] = 0.02 * torch.randn(hc, generator=w.g)
        w.t[f"{p}.hc_head_scale"] = torch.ones(1)
        out.update(w.t)
    return out


# Where each family's config says how many MTP layers it has (the field vLLM's MTP model reads)
MTP_FIELD = {"deepseek_v3": "num_nextn_predict_layers", "glm4_moe": "num_nextn_predict_layers",
             "glm_moe_dsa": "num_nextn_predict_layers", "deepseek_v4": "num_nextn_predict_layers",
             "qwen3_next": "num_nextn_predict_layers", "qwen3_5_moe": "mtp_num_hidden_layers",
             "kimi_k3": "num_nextn_predict_layers", "deepseek_v41": "num_nextn_predict_layers",
             "minimax_m3": "num_mtp_modules", "qwen4_exp": "mtp_num_hidden_layers",
             "glm5_next": "num_nextn_predict_layers", "glm5_next_vl": "num_nextn_predict_layers"}
# The families whose MTP layers live under mtp. (mtp.layers.<i>); DeepSeek-V4's under mtp.<i>; MiniMax-M3's under
# language_model.model.mtp.layers.<i>; DeepSeek-V3's, GLM-4.5's, GLM-5's and GLM-5.3's follow their decoder layers
# (model.layers.<L + i>)
MTP_UNDER_MTP = ("qwen3_next", "qwen3_5_moe", "qwen4_exp")


def _with_qwen_next_mtp_layers(tensors: Dict[str, torch.Tensor], arch: str, s: dict, seed: int,
                               mtp: int) -> Dict[str, torch.Tensor]:
    """Qwen3-Next's / Qwen3.5's MTP layers as released (vLLM's qwen3_next_mtp / qwen3_5_mtp read them): under mtp.,
    each a full-attention MoE decoder layer (gated attention, gated shared expert, routed experts) at
    mtp.layers.<i>, after fc over [embedding; hidden] and its two input norms pre_fc_norm_embedding / _hidden, and
    a final mtp.norm; the embedding and lm_head are the target's. Zero-centred norms are 0, as in the model."""
    out = dict(tensors)
    H = s["H"]
    for i in range(mtp):  # a one-layer model whose only layer is full attention (every=1), renamed
        layer = _qwen3_next_weights(dict(s, L=1, every=1), _Weights(seed + 7 + i), split_in_proj=arch == "qwen3_5_moe")
        src = "model.layers.0."
        out.update((f"mtp.layers.{i}." + n[len(src):], t) for n, t in layer.items() if n.startswith(src))
    w = _Weights(seed + 7 + mtp)
    w.linear("mtp.fc", H, 2 * H)
    for norm in ("mtp.norm", "mtp.pre_fc_norm_embedding", "mtp.pre_fc_norm_hidden"):
        w.t[f"{norm}.weight"] = torch.zeros(H, dtype=torch.bfloat16)
    out.update(w.t)
    return out


def _qwen3_next_weights(s: dict, w: "_Weights", split_in_proj: bool = False) -> Dict[str, torch.Tensor]:
    """Hub names and shapes of Qwen3-Next (transformers' Qwen3NextForCausalLM holds the same, with its
    experts fused): zero-centred norms are 0, the gated DeltaNet's output norm 1. split_in_proj: the GDN
    input projections one per output as Qwen3.5 releases them (Qwen3-Next fuses qkvz and ba)."""
    H = s["H"]
    zero = lambda name, n: w.t.__setitem__(f"{name}.weight", torch.zeros(n, dtype=torch.bfloat16))  # noqa: E731
    zero("model.norm", H)
    key, value = s["lin_nk"] * s["lin_dk"], s["lin_nv"] * s["lin_dv"]
    for i in range(s["L"]):
        p = f"model.layers.{i}"
        zero(f"{p}.input_layernorm", H)
        zero(f"{p}.post_attention_layernorm", H)
        if (i + 1) % s["every"]:
            a = f"{p}.linear_attn"
            if split_in_proj:
                w.linear(f"{a}.in_proj_qkv", 2 * key + value, H)
                w.linear(f"{a}.in_proj_z", value, H)
                w.linear(f"{a}.in_proj_b", s["lin_nv"], H)
                w.linear(f"{a}.in_proj_a", s["lin_nv"], H)
            else:
                w.linear(f"{a}.in_proj_qkvz", 2 * key + 2 * value, H)
                w.linear(f"{a}.in_proj_ba", 2 * s["lin_nv"], H)
            w.t[f"{a}.conv1d.weight"] = (torch.randn(2 * key + value, 1, s["conv"], generator=w.g)
                                         / math.sqrt(s["conv"])).to(torch.bfloat16)
            w.t[f"{a}.dt_bias"] = torch.ones(s["lin_nv"], dtype=torch.bfloat16)
            w.t[f"{a}.A_log"] = torch.log(torch.empty(s["lin_nv"]).uniform_(1, 16, generator=w.g)).to(torch.bfloat16)
            w.norm(f"{a}.norm", s["lin_dv"])
            w.linear(f"{a}.out_proj", H, value)
        else:
            a = f"{p}.self_attn"
            w.linear(f"{a}.q_proj", 2 * s["nh"] * s["hd"], H)  # queries and their output gate
            w.linear(f"{a}.k_proj", s["nkv"] * s["hd"], H)
            w.linear(f"{a}.v_proj", s["nkv"] * s["hd"], H)
            w.linear(f"{a}.o_proj", H, s["nh"] * s["hd"])
            zero(f"{a}.q_norm", s["hd"])
            zero(f"{a}.k_norm", s["hd"])
        m = f"{p}.mlp"
        w.linear(f"{m}.gate", s["E"], H)
        w.mlp(f"{m}.shared_expert", H, s["shared_I"])
        w.linear(f"{m}.shared_expert_gate", 1, H)
        for e in range(s["E"]):
            w.mlp(f"{m}.experts.{e}", H, s["I"])
    return w.t


def _corpus():
    words = ("the of and to in is was for on that with as by at from his her an were are which this be "
             "mixture experts layer token model memory bandwidth host device prefill decode cache route "
             "alpha beta gamma delta zero one two three four five six seven eight nine ten").split()
    g = torch.Generator().manual_seed(7)
    for _ in range(2000):
        idx = torch.randint(len(words), (12,), generator=g).tolist()
        yield " ".join(words[i] for i in idx) + ". 0123456789 ,;:!?"


# Tokens a model expects at a fixed id of its release's vocabulary (written when the vocabulary reaches it)
FIXED_ID_TOKENS = {deepseek_v41.IMAGE_PLACEHOLDER[1]: deepseek_v41.IMAGE_PLACEHOLDER[0]}


def write_tokenizer(out: str, vocab_size: int, extra_special=(), fill_to: int = 0) -> int:
    """extra_special: more special tokens, ids right after SPECIAL's (vision tokens of VL models).
    fill_to: pad the vocabulary with reserved tokens up to this size (a model that maps every token id the
    way its tokenizer does, as DeepSeek-V4.1's Engram, then meets no id its tokenizer lacks)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL + list(extra_special),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus(), trainer)
    if fill_to > tok.get_vocab_size():
        fixed = FIXED_ID_TOKENS if fill_to > max(FIXED_ID_TOKENS) else {}
        tok.add_tokens([fixed.get(i, f"<|reserved_{i}|>") for i in range(tok.get_vocab_size(), fill_to)])
    tok.save(os.path.join(out, "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": "<|im_end|>",
           "pad_token": "<|endoftext|>", "unk_token": None, "model_max_length": 4096,
           "chat_template": CHAT_TEMPLATE, "clean_up_tokenization_spaces": False}
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    return tok.get_vocab_size()


def writes_config_only(arch: str, size: str, mtp: int = 0) -> bool:
    """Whether make_checkpoint writes no weights (serve with --load-format dummy): big sizes, the CONFIG_ONLY
    architectures, and Kimi-K3 with MTP layers (not written: vLLM's dummy weights fill the whole model)."""
    return size != "tiny" or arch in CONFIG_ONLY or (arch == "kimi_k3" and bool(mtp))


def make_checkpoint(arch: str, out: str, size: str = "tiny", seed: int = 0, layers: int = 0,
                    quant: str = "bf16", fp8_experts_only: bool = False, experts_only: bool = False,
                    mtp: int = 0, ple_rows: int = 0) -> str:
    """layers: override the layer count (e.g. a shorter "big" model for a quicker benchmark start).
    ple_rows: override the n-gram vocabulary base of the per-layer embedding (PLE) tables (Qwen3.8-Flash-Next; "big":
    20M rows, a ~48 GiB FP8 table that vLLM's dummy loader fills through a full-size fp16 temporary; fewer rows give a
    decode benchmark of the real widths that fits a 125 GiB host, the lookups unchanged but for the table's size).
    quant: "bf16", "fp8" (block-quantized like DeepSeek-V3 / Qwen3-FP8), "w4a16" (int4 experts,
    compressed-tensors, like Kimi-K2-Thinking), "nvfp4" (ModelOpt NVFP4, like nvidia/Qwen3-30B-A3B-FP4),
    "fp8_channel" / "int8_channel" (compressed-tensors W8A8 per output channel, dynamic per-token
    activations, like RedHatAI/*-FP8-dynamic / *-quantized.w8a8), "mxfp4_ct" (compressed-tensors MXFP4
    experts, like Kimi-K3; the other projections bf16; "mxfp4_ct_a8": its W4A8 variant, FP8 activations);
    DeepSeek-V4 / V4.1: "mxfp4", "fp8" or "nvfp4" are their routed experts in the layouts vLLM's V4 quantization
    config selects (lvllm.testing.deepseek_v4.RELEASE_FORMATS), the other projections bf16.
    quantized variants: tiny only, but DeepSeek-V4's mxfp4 and fp8, Kimi-K3's mxfp4_ct and the FP8_RELEASES' fp8 (big:
    the release's quantization config over dummy weights).
    experts_only (fp8, nvfp4, fp8_channel, int8_channel; fp8_experts_only is its old name): quantize
    the routed experts only, every other projection stays bf16 (vLLM's CPU platform has no FP8/NVFP4
    linear kernels).
    mtp (the MTP_FIELD families): that many MTP / NextN layers as each family releases them, for vLLM's MTP
    speculative decoding (a config-only model, "big" included: the config's count, vLLM's dummy weights fill them);
    tiny ones written: DeepSeek-V3's, GLM-4.5's and GLM-5's after the decoder layers (model.layers.<L + i>: a
    whole MoE decoder layer with enorm, hnorm, eh_proj, shared_head and a copy of the embedding), DeepSeek-V4's
    under mtp.<i> (_with_deepseek_v4_mtp_layers; bf16 only), Qwen3-Next's and Qwen3.5's under mtp.layers.<i>
    (_with_qwen_next_mtp_layers), MiniMax-M3's under language_model.model.mtp.layers.<i> (minimax_m3.mtp_weights),
    Qwen3.8-Flash-Next's under mtp. (qwen4_exp.mtp_weights), GLM-5.3's after its decoder layers
    (glm5_next.mtp_weights); the other weights are the same as without them. DeepSeek-V4.1's are DSpark stages
    under mtp.<i> (deepseek_v41.mtp_weights, its config fields deepseek_v41.dspark_fields)."""
    if mtp and arch not in MTP_FIELD:
        raise ValueError(f"mtp layers are written for {', '.join(MTP_FIELD)} only")
    if mtp and arch == "deepseek_v4" and quant != "bf16" and size == "tiny":
        raise ValueError("deepseek_v4 tiny: mtp layers with bf16 weights only (the FP8 config written beside MXFP4 "
                         "experts names the target's layers; big: the release's config, dummy weights)")
    if quant not in QUANTS + ("mxfp4",):
        raise ValueError(f"quant must be one of {', '.join(QUANTS + ('mxfp4',))}")
    v4_experts = arch in ("deepseek_v4", "deepseek_v41") and quant in deepseek_v4.RELEASE_FORMATS
    release = ((v4_experts and quant in ("mxfp4", "fp8")) or (arch == "kimi_k3" and quant == "mxfp4_ct")
               or (arch in FP8_RELEASES and quant == "fp8"))
    if quant != "bf16" and size != "tiny" and not release:
        raise ValueError("quantized variants are written for --size tiny only (and the releases' formats: DeepSeek-V4's "
                         f"mxfp4 and fp8 (V4-Flash-Base), Kimi-K3's mxfp4_ct, {', '.join(FP8_RELEASES)}'s block fp8)")
    if arch == "kimi_k3" and quant not in ("bf16", "mxfp4_ct"):
        raise ValueError("kimi_k3: bf16, or mxfp4_ct (the release's compressed-tensors MXFP4 experts)")
    if arch == "gpt_oss" and quant != "bf16":
        raise ValueError("gpt_oss checkpoints always hold MXFP4 experts (as released); use the default quant")
    if arch not in ARCHS:
        raise ValueError(f"unknown architecture {arch!r}; choose from {', '.join(ARCHS)}")
    if size not in ("tiny", "big"):
        raise ValueError("size must be tiny or big")
    if arch in CONFIG_MODULES and size not in CONFIG_MODULES[arch].SHAPES:
        raise ValueError(f"{arch}: size {size} is not written (its release config is not public here)")
    shapes = CONFIG_MODULES[arch].SHAPES if arch in CONFIG_MODULES else SHAPES[arch]
    s = dict(SHAPES[VL_TEXT[arch]][size], **shapes[size]) if arch in VL_TEXT else dict(shapes[size])
    if arch in VL_TEXT and quant != "bf16" and (arch, quant) != ("kimi_k25", "w4a16"):
        raise ValueError(f"{arch}: bf16 only" + (", or w4a16 (the release's int4 experts)" if arch == "kimi_k25" else
                                                 " (the quantizers do not know the vision tower's layers)"))
    if arch in ("deepseek_v4", "deepseek_v41") and quant != "bf16" and not v4_experts:
        raise ValueError(f"{arch}: bf16, or its routed experts as mxfp4 (as released), fp8 (block, as "
                         "V4-Flash-Base) or nvfp4 (ModelOpt's, by the config's moe_quant_algo); the other layers bf16")
    if quant == "mxfp4" and arch not in ("deepseek_v4", "deepseek_v41"):
        raise ValueError("quant mxfp4 is DeepSeek-V4's expert layout (gpt_oss holds MXFP4 experts as released)")
    if layers:
        s["L"] = layers
    if ple_rows:
        if "ple_base" not in s:
            raise ValueError(f"{arch} has no per-layer embedding (PLE) tables: ple_rows is for qwen4_exp")
        s["ple_base"] = ple_rows
    os.makedirs(out, exist_ok=True)
    n_tok = write_tokenizer(out, min(s["V"], 2048), VISION_SPECIAL.get(arch, ()),
                            fill_to=s["V"] if arch == "deepseek_v41" else 0)
    for name, content in VL_PROCESSOR_FILES.get(arch, {}).items():
        with open(os.path.join(out, name), "w") as f:
            json.dump(content, f, indent=1)
    vocab = max(s["V"], n_tok)
    if arch == "deepseek_v41":
        config = deepseek_v41.config(_config("deepseek_v4", s, vocab), s, out)
    elif arch == "kimi_k3":
        config = kimi_k3.config(s, vocab, image_token_id=len(SPECIAL))
    elif arch in CONFIG_MODULES:
        config = CONFIG_MODULES[arch].config(s, vocab)
    else:
        config = _config(arch, s, vocab)
    tensors = None if writes_config_only(arch, size, mtp) else _weights(arch, s, vocab, seed)
    if mtp:  # (a config-only model, Kimi-K3 with MTP, gets vLLM's dummy weights in its MTP layers too)
        config.get("text_config", config)[MTP_FIELD[arch]] = mtp
    if mtp and arch == "deepseek_v41":  # V4.1's MTP layers are DSpark stages
        config["text_config"].update(deepseek_v41.dspark_fields(s, s["L"], vocab))
    if mtp and tensors is not None:
        if hasattr(CONFIG_MODULES.get(arch), "mtp_weights"):  # a family module writing its own MTP layers
            w = _Weights(seed + 100)  # (their own generator: the target's tensors stay those of mtp=0)
            CONFIG_MODULES[arch].mtp_weights(s, w, mtp, tensors)
            tensors = dict(tensors, **w.t)
        elif arch in MTP_UNDER_MTP:
            tensors = _with_qwen_next_mtp_layers(tensors, arch, s, seed, mtp)
        elif arch == "deepseek_v4":
            tensors = _with_deepseek_v4_mtp_layers(tensors, s, vocab, seed, mtp)
        else:
            tensors = _with_mtp_layers(tensors, arch, s, vocab, seed, mtp)
    experts_only = experts_only or fp8_experts_only
    if tensors is None and quant == "mxfp4_ct":  # Kimi-K3 big or with MTP: the experts' compressed-tensors MXFP4
        config["quantization_config"] = ct_mxfp4_config()
    elif tensors is None and v4_experts:  # big: the release's formats, every projection FP8 but the experts
        deepseek_v4.release_quant(config, fmt=quant)
    elif tensors is None and quant == "fp8":  # big: the FP8 release's block quantization over dummy weights
        config["quantization_config"] = fp8_release_config(config)
    elif tensors is not None and v4_experts:
        tensors = deepseek_v4.release_experts(tensors, config, quant)
    elif tensors is not None:
        experts_only = experts_only or (arch, quant) == ("minimax_m3", "mxfp8")  # its release: MXFP8 experts only
        tensors, qc, extra = quantize_checkpoint(tensors, quant, experts_only=experts_only)
        if (arch, quant) == ("minimax_m3", "mxfp8"):
            tensors, qc, extra = minimax_m3.mxfp8_release(tensors, qc)
        if qc is not None and arch == "kimi_k25":  # as released: the text model's config carries it
            config["text_config"]["quantization_config"] = qc
        elif qc is not None:
            config["quantization_config"] = qc
        for name, content in extra.items():
            with open(os.path.join(out, name), "w") as f:
                json.dump(content, f, indent=1)
    if arch == "deepseek_v41" and v4_experts:
        deepseek_v41.release_quant_as_v41(config)
    eos = SPECIAL.index("<|im_end|>")
    config.update(bos_token_id=eos, eos_token_id=eos)
    if "text_config" in config:
        config["text_config"].update(bos_token_id=eos, eos_token_id=eos)
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
    ap.add_argument("--quant", default="bf16", choices=QUANTS + ("mxfp4",),
                    help="expert/projection format (tiny only, but the releases', also big: DeepSeek-V4's mxfp4 "
                         "and fp8, Kimi-K3's mxfp4_ct, the FP8 releases' fp8)")
    ap.add_argument("--experts-only", action="store_true",
                    help="fp8, nvfp4, fp8_channel, int8_channel: quantize the routed experts only "
                         "(other projections stay bf16)")
    ap.add_argument("--mtp", type=int, default=0,
                    help=f"{', '.join(MTP_FIELD)}: that many MTP layers, as released (big: in the config)")
    ap.add_argument("--ple-rows", type=int, default=0,
                    help="qwen4_exp: the n-gram vocabulary base of its PLE tables (big: 20M as released)")
    a = ap.parse_args(argv)
    make_checkpoint(a.arch, a.out, a.size, a.seed, a.layers, a.quant, experts_only=a.experts_only, mtp=a.mtp,
                    ple_rows=a.ple_rows)
    print(f"wrote {a.size} {a.arch} checkpoint to {a.out}"
          + (" (config + tokenizer only: serve with --load-format dummy)"
             if writes_config_only(a.arch, a.size, a.mtp) else "")
          + (" (no vision tower weights: serve with --language-model-only)" if a.arch in LANGUAGE_MODEL_ONLY else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
