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
(compressed-tensors, `make_checkpoint(..., quant="mxfp4_ct")`). Config only: no weights are written for
Kimi-K3 yet, serve it with --load-format dummy.
"""
from __future__ import annotations

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
