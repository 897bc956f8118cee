"""Kimi-K3's config.json for lvllm.testing.tiny_checkpoint, as vLLM 0.33.0's KimiK3Config reads it: a KimiLinear text
model under text_config (Kimi Delta Attention layers with one MLA layer in every four, NoPE; a dense first layer,
then latent MoE layers: the router and a shared expert on the hidden state, the routed experts on a narrower latent
projection of it; Kimi's SituGLU activation) beside a MoonViT vision tower (Kimi-K2.5's, whose media processor
config tiny_checkpoint writes for both).

The release's config.json is not public here: the tiny shape is small and keeps the kernels' fixed widths (KDA
heads of 128, MLA's 512-wide latent KV). big: the text shapes vLLM 0.33.0's own Kimi-K3 decode kernels are written
for (models/kimi_k3/amd/specialized_decode: hidden 7168, 896 routed experts, top-16, a 3584-wide latent, routed
intermediate 3072 (384 a rank at TP 8), shared intermediate 6144 (two experts' worth), 96 KDA heads of 128, a
4-wide short conv, SiTU beta 4 and linear beta 25); what those kernels do not fix is Kimi-K2's (61 layers, 64 MLA
heads, a dense first layer of 18432, vocabulary 163840, q-LoRA 1536): an assumption, and benchmarks override the
layer count anyway. Its vision tower stays tiny (the benchmarks are text-only). Released as MXFP4 experts
(compressed-tensors, `make_checkpoint(..., quant="mxfp4_ct")`).

Weights (tiny only; big: --load-format dummy): `weights` writes every tensor vLLM 0.33.0's Kimi-K3 loader reads, in
the names it maps from (KimiLinear's Hub names: q/k/v/g/f_a/b projections and q/k/v short convolutions the loader
fuses, MLA's q_a / kv_a / output-gate projections, per-expert w1/w2/w3 on the latent width, the latent MoE's
routed_expert_down_proj / _norm / _up_proj around them; the MoonViT tower and a projector under mm_projector.proj.0/2);
tests/plugin's CPU load through vLLM's own loader fails on any tensor it does not take or any parameter left unloaded.
"""
from __future__ import annotations

import math

IMAGE_PLACEHOLDER = "<|kimi_image_placeholder|>"

SHAPES = {
    "tiny": dict(H=512, L=4, nh=8, E=32, K=4, I=128, latent=256, dense_I=1024, V=2048, kda_heads=4, kda_dim=128,
                 q_lora=256, kv_lora=512, nope=128, rope=64, v=128, situ_beta=4.0, situ_linear_beta=25.0, vis_depth=1,
                 vis_H=64, vis_I=128, vis_heads=2, vis_pos=8),
    "big": dict(H=7168, L=61, nh=64, E=896, K=16, I=3072, shared=2, latent=3584, dense_I=18432, V=163840,
                kda_heads=96, kda_dim=128, q_lora=1536, kv_lora=512, nope=128, rope=64, v=128, situ_beta=4.0,
                situ_linear_beta=25.0, vis_depth=1, vis_H=64, vis_I=128, vis_heads=2, vis_pos=8),
}


def config(s: dict, vocab: int, image_token_id: int) -> dict:
    """image_token_id: the tokenizer's id of IMAGE_PLACEHOLDER (the config's media_placeholder_token_id)."""
    L = s["L"]
    full_attention = [i + 1 for i in range(L) if (i + 1) % 4 == 0]  # 1-based, as the release lists them
    text = dict(model_type="kimi_linear", vocab_size=vocab, hidden_size=s["H"], num_hidden_layers=L,
                num_attention_heads=s["nh"], num_key_value_heads=s["nh"], intermediate_size=s["dense_I"],
                hidden_act="situ", activation_situ_beta=s["situ_beta"],
                activation_situ_linear_beta=s.get("situ_linear_beta"),
                rms_norm_eps=1e-5, max_position_embeddings=32768, rope_theta=10000.0, tie_word_embeddings=False,
                q_lora_rank=s["q_lora"], kv_lora_rank=s["kv_lora"], qk_nope_head_dim=s["nope"],
                qk_rope_head_dim=s["rope"], v_head_dim=s["v"], mla_use_nope=True, mla_use_output_gate=True,
                num_experts=s["E"], num_experts_per_token=s["K"], moe_intermediate_size=s["I"],
                num_shared_experts=s.get("shared", 1),
                routed_expert_hidden_size=s["latent"], latent_moe_use_norm=True, moe_renormalize=True,
                moe_router_activation_func="sigmoid", use_grouped_topk=True, num_expert_group=1, topk_group=1,
                routed_scaling_factor=2.5, topk_method="noaux_tc", first_k_dense_replace=1, moe_layer_freq=1,
                num_nextn_predict_layers=0,
                linear_attn_config={"kda_layers": [i + 1 for i in range(L) if i + 1 not in full_attention],
                                    "full_attn_layers": full_attention, "head_dim": s["kda_dim"],
                                    "num_heads": s["kda_heads"], "short_conv_kernel_size": 4,
                                    "use_full_rank_gate": True})
    vision = dict(patch_size=14, init_pos_emb_height=s["vis_pos"], init_pos_emb_width=s["vis_pos"], init_pos_emb_time=4,
                  vt_num_attention_heads=s["vis_heads"], vt_num_hidden_layers=s["vis_depth"], vt_hidden_size=s["vis_H"],
                  vt_intermediate_size=s["vis_I"], qkv_hidden_size=3 * s["vis_H"], merge_kernel_size=[2, 2],
                  text_hidden_size=s["H"])
    return dict(architectures=["KimiK3ForConditionalGeneration"], model_type="kimi_k3", text_config=text,
                vision_config=vision, media_placeholder_token_id=image_token_id, image_placeholder=IMAGE_PLACEHOLDER,
                tie_word_embeddings=False, torch_dtype="bfloat16")


TEXT = "language_model."  # the text model's prefix in the release (vLLM's KimiK3ForConditionalGeneration)


def weights(s: dict, vocab: int, w) -> None:
    """The tiny model's tensors into `w` (tiny_checkpoint's _Weights): the tiny checkpoints' values (projections
    N(0, 1/fan_in), the output head at a gain of 3, unit norms), KDA's decay parameters at the usual initial ranges
    (A_log = log of 1..16, dt_bias the inverse softplus of 0.001..0.1), its short convolutions N(0, 1/width)."""
    import torch
    H = s["H"]
    w.t[f"{TEXT}model.embed_tokens.weight"] = torch.randn(vocab, H, generator=w.g).to(torch.bfloat16)
    w.linear(f"{TEXT}lm_head", vocab, H, gain=3.0)
    w.norm(f"{TEXT}model.norm", H)
    for i in range(s["L"]):
        p = f"{TEXT}model.layers.{i}"
        w.norm(f"{p}.input_layernorm", H)
        w.norm(f"{p}.post_attention_layernorm", H)
        (_mla if (i + 1) % 4 == 0 else _kda)(s, w, f"{p}.self_attn")
        if i == 0:  # first_k_dense_replace = 1
            w.mlp(f"{p}.mlp", H, s["dense_I"])
        else:
            _latent_moe(s, w, f"{p}.block_sparse_moe")
    _vision_tower(s, w)


def _kda(s: dict, w, a: str) -> None:
    """Kimi Delta Attention with the full-rank output gate (use_full_rank_gate): vLLM fuses q/k/v/g/f_a/b into one
    projection and the three short convolutions into one."""
    import torch
    H, nh, d = s["H"], s["kda_heads"], s["kda_dim"]
    for name in ("q_proj", "k_proj", "v_proj", "g_proj"):
        w.linear(f"{a}.{name}", nh * d, H)
    w.linear(f"{a}.f_a_proj", d, H)
    w.linear(f"{a}.f_b_proj", nh * d, d)
    w.linear(f"{a}.b_proj", nh, H)
    for name in ("q_conv1d", "k_conv1d", "v_conv1d"):
        w.t[f"{a}.{name}.weight"] = (torch.randn(nh * d, 1, 4, generator=w.g) / 2.0).to(torch.bfloat16)
    w.t[f"{a}.A_log"] = torch.log(1 + 15 * torch.rand(nh, generator=w.g))
    dt = torch.exp(torch.empty(nh * d).uniform_(math.log(1e-3), math.log(0.1), generator=w.g))
    w.t[f"{a}.dt_bias"] = dt + torch.log(-torch.expm1(-dt))  # softplus(dt_bias) = dt
    w.norm(f"{a}.o_norm", d)
    w.linear(f"{a}.o_proj", H, nh * d)


def _mla(s: dict, w, a: str) -> None:
    """NoPE MLA with an output gate (mla_use_output_gate): vLLM fuses q_a, kv_a and the gate's projection."""
    H, nh, nope, rope, v = s["H"], s["nh"], s["nope"], s["rope"], s["v"]
    w.linear(f"{a}.q_a_proj", s["q_lora"], H)
    w.norm(f"{a}.q_a_layernorm", s["q_lora"])
    w.linear(f"{a}.q_b_proj", nh * (nope + rope), s["q_lora"])
    w.linear(f"{a}.kv_a_proj_with_mqa", s["kv_lora"] + rope, H)
    w.norm(f"{a}.kv_a_layernorm", s["kv_lora"])
    w.linear(f"{a}.kv_b_proj", nh * (nope + v), s["kv_lora"])
    w.linear(f"{a}.g_proj", nh * v, H)
    w.linear(f"{a}.o_proj", H, nh * v)


def _latent_moe(s: dict, w, m: str) -> None:
    """The router and the shared expert(s) on the hidden state; the routed experts on the latent projection of it
    (routed_expert_down_proj, RMS-normed), their sum projected back (routed_expert_up_proj)."""
    import torch
    H, E, I, latent = s["H"], s["E"], s["I"], s["latent"]
    w.linear(f"{m}.gate", E, H)
    w.t[f"{m}.gate.e_score_correction_bias"] = 0.01 * torch.randn(E, generator=w.g)  # fp32 as released
    w.mlp(f"{m}.shared_experts", H, I * s.get("shared", 1))
    w.linear(f"{m}.routed_expert_down_proj", latent, H)
    w.norm(f"{m}.routed_expert_norm", latent)
    w.linear(f"{m}.routed_expert_up_proj", H, latent)
    for e in range(E):
        w.mlp(f"{m}.experts.{e}", latent, I, ("w1", "w3", "w2"))


def _vision_tower(s: dict, w) -> None:
    """MoonViT as KimiK3VisionConfig builds it by default (RMS norms, no biases, q/k/v of qkv_hidden_size each in one
    wqkv) and the projector's two layers (the release's proj.0 / proj.2) with its post-norm."""
    import torch
    Hv, qkv, v = s["vis_H"], 3 * s["vis_H"], "vision_tower"
    w.t[f"{v}.patch_embed.proj.weight"] = (torch.randn(Hv, 3, 14, 14, generator=w.g) / math.sqrt(3 * 14 * 14)
                                           ).to(torch.bfloat16)
    w.t[f"{v}.patch_embed.pos_emb.weight"] = (0.1 * torch.randn(s["vis_pos"], s["vis_pos"], Hv, generator=w.g)
                                              ).to(torch.bfloat16)
    for i in range(s["vis_depth"]):
        b = f"{v}.encoder.blocks.{i}"
        w.norm(f"{b}.norm0", Hv)
        w.norm(f"{b}.norm1", Hv)
        w.linear(f"{b}.wqkv", 3 * qkv, Hv)
        w.linear(f"{b}.wo", Hv, qkv)
        w.linear(f"{b}.mlp.fc0", s["vis_I"], Hv)
        w.linear(f"{b}.mlp.fc1", Hv, s["vis_I"])
    w.norm(f"{v}.encoder.final_layernorm", Hv)
    w.linear("mm_projector.proj.0", 4 * Hv, 4 * Hv)
    w.linear("mm_projector.proj.2", s["H"], 4 * Hv)
    w.norm("mm_projector.post_norm", s["H"])
