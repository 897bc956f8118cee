"""MiniMax-M3's config.json for lvllm.testing.tiny_checkpoint as released: the vision-language architecture
(MiniMaxM3SparseForConditionalGeneration, model_type minimax_m3_vl) with its text model under text_config and its
tensors under language_model. (vLLM 0.33.0 builds it there; its MTP draft, built under the empty prefix, needs that:
on the text-only MiniMaxM3SparseForCausalLM the draft's attention takes the target's layer-0 name and vLLM stops,
"Duplicate layer name"). GQA attention with head_dim 128 (the kernels' fixed width), per-head QK norm, partial RoPE;
dense first layers, then MoE layers (moe_layer_freq, a 0/1 flag per layer) whose attention is block-sparse with a
lightning indexer (sparse_attention_freq, the same flags, as released); sigmoid routing with a selection bias and a
routed scale of 2; a shared expert; swigluoai experts on [gate; up] rows (vLLM's swigluoai_uninterleave: alpha 1.702,
beta 1.0, limit 7.0), w1/w2/w3 checkpoint names.

The vision tower is described (vision_config: transformers' MiniMaxM3VLVisionConfig defaults for big, a small one for
tiny) but its weights are not written: serve these checkpoints with --language-model-only (LANGUAGE_MODEL_ONLY in
tiny_checkpoint), which skips the tower as a text-only deployment of the release does.

big: vLLM's MiniMaxM3TextConfig defaults (60 layers, 128 experts, top-4, hidden 6144, expert size 3072): the
released shape, config only (serve it with --load-format dummy). tiny: with bf16 weights under the names vLLM
0.33.0's MiniMaxM3SparseForConditionalGeneration loads (`weights`): q/k/v/o projections with per-head q/k norms, on
the sparse (MoE) layers the indexer's index_q_proj (a head per KV head) and index_k_proj (one head) with their norms,
the router in fp32 with its selection bias, a shared expert, routed experts w1 (gate) / w3 (up) / w2 (down). Its
release ships bf16 or MXFP8 experts: quant "mxfp8" writes the routed experts as the MXFP8 release holds them
(`mxfp8_release`), the rest bf16.
"""
from __future__ import annotations

SHAPES = {
    "tiny": dict(H=256, L=4, dense=1, nh=4, nkv=2, E=8, K=2, I=128, dense_I=512, V=2048, ctx=32768,
                 vis_H=64, vis_I=128, vis_depth=1, vis_heads=2),
    "big": dict(H=6144, L=60, dense=3, nh=64, nkv=4, E=128, K=4, I=3072, dense_I=12288, V=200064, ctx=524288,
                vis_H=1280, vis_I=5120, vis_depth=32, vis_heads=16),
}
# Where the release keeps its text model's tensors (vLLM's MTP loader strips the same prefix)
TEXT = "language_model."


def config(s: dict, vocab: int) -> dict:
    L, dense = s["L"], s["dense"]
    moe = [0] * dense + [1] * (L - dense)  # per layer: 1 = MoE (and block-sparse attention), 0 = dense
    sparse = dict(use_sparse_attention=True, sparse_index_dim=128, sparse_num_index_heads=s["nkv"],
                  sparse_topk_blocks=16, sparse_block_size=128, sparse_disable_index_value=list(moe),
                  sparse_score_type="max", sparse_init_block=0, sparse_local_block=1, sparse_attention_freq=list(moe))
    text = dict(model_type="minimax_m3_text", vocab_size=vocab, hidden_size=s["H"], intermediate_size=s["I"],
                dense_intermediate_size=s["dense_I"], shared_intermediate_size=s["I"], num_hidden_layers=L,
                num_attention_heads=s["nh"], num_key_value_heads=s["nkv"], head_dim=128,
                max_position_embeddings=s["ctx"], rms_norm_eps=1e-6, use_gemma_norm=True, attention_output_gate=False,
                rope_theta=5000000, rotary_dim=64, partial_rotary_factor=0.5, hidden_act="swigluoai",
                swiglu_alpha=1.702, swiglu_beta=1.0, swiglu_limit=7.0, use_qk_norm=True, qk_norm_type="per_head",
                num_local_experts=s["E"], num_experts_per_tok=s["K"], n_shared_experts=1, scoring_func="sigmoid",
                use_routing_bias=True, routed_scaling_factor=2.0, num_mtp_modules=1, moe_layer_freq=moe,
                sparse_attention_config=sparse, tie_word_embeddings=False)
    vision = dict(model_type="minimax_m3_vl_vision", hidden_size=s["vis_H"], intermediate_size=s["vis_I"],
                  num_hidden_layers=s["vis_depth"], num_attention_heads=s["vis_heads"], num_channels=3, patch_size=14,
                  temporal_patch_size=2, spatial_merge_size=2, img_token_compression_config={"spatial_merge_size": 2},
                  hidden_act="gelu", layer_norm_eps=1e-5)
    return dict(architectures=["MiniMaxM3SparseForConditionalGeneration"], model_type="minimax_m3_vl",
                text_config=text, vision_config=vision, projector_hidden_size=s["H"], tie_word_embeddings=False,
                torch_dtype="bfloat16")


def weights(s: dict, vocab: int, w) -> None:
    """The tiny model's tensors into `w` (tiny_checkpoint's _Weights: linear / mlp writers). Every norm is Gemma-style
    (use_gemma_norm: x * (1 + weight), vLLM's MiniMAXGemmaRMSNorm), so its weights are 0 for a gain of 1 as in the
    other tiny checkpoints; weights of 1 would double every norm's output (attention scores x4, logits x2)."""
    import torch
    w.t[f"{TEXT}model.embed_tokens.weight"] = torch.randn(vocab, s["H"], generator=w.g).to(torch.bfloat16)
    w.linear(f"{TEXT}lm_head", vocab, s["H"], gain=3.0)
    _norm(w, f"{TEXT}model.norm", s["H"])
    for i in range(s["L"]):
        _decoder_layer(s, w, f"{TEXT}model.layers.{i}", moe=i >= s["dense"])


def mtp_weights(s: dict, w, n: int, target: dict) -> None:
    """n MTP modules as vLLM's MiniMaxM3MTP loads them (language_model.model.mtp.layers.<i>): enorm / hnorm over the
    token's embedding and the target's hidden state, eh_proj over both, a decoder layer with block-sparse attention and
    MoE under transformer_layer (the target's MoE layer names below it), final_layernorm; the embedding and lm_head
    are the target's (`target`, its tensors: not needed here)."""
    for i in range(n):
        p = f"{TEXT}model.mtp.layers.{i}"
        for name in ("enorm", "hnorm", "final_layernorm"):
            _norm(w, f"{p}.{name}", s["H"])
        w.linear(f"{p}.eh_proj", s["H"], 2 * s["H"])
        _decoder_layer(s, w, f"{p}.transformer_layer", moe=True)


def _norm(w, name: str, n: int) -> None:
    import torch
    w.t[f"{name}.weight"] = torch.zeros(n, dtype=torch.bfloat16)


def _decoder_layer(s: dict, w, p: str, moe: bool) -> None:
    """A decoder layer's tensors: attention with per-head q/k norms; a dense MLP, or (moe) the lightning indexer of
    the block-sparse attention and the MoE block (fp32 router with its selection bias, shared expert, w1/w3/w2)."""
    import torch
    H, hd = s["H"], 128
    _norm(w, f"{p}.input_layernorm", H)
    _norm(w, f"{p}.post_attention_layernorm", H)
    a = f"{p}.self_attn"
    w.linear(f"{a}.q_proj", s["nh"] * hd, H)
    w.linear(f"{a}.k_proj", s["nkv"] * hd, H)
    w.linear(f"{a}.v_proj", s["nkv"] * hd, H)
    w.linear(f"{a}.o_proj", H, s["nh"] * hd)
    _norm(w, f"{a}.q_norm", hd)
    _norm(w, f"{a}.k_norm", hd)
    if not moe:
        w.mlp(f"{p}.mlp", H, s["dense_I"])
        return
    w.linear(f"{a}.index_q_proj", s["nkv"] * hd, H)  # the lightning indexer of the sparse layers
    w.linear(f"{a}.index_k_proj", hd, H)
    _norm(w, f"{a}.index_q_norm", hd)
    _norm(w, f"{a}.index_k_norm", hd)
    m = f"{p}.block_sparse_moe"
    w.t[f"{m}.gate.weight"] = torch.randn(s["E"], H, generator=w.g) / H ** 0.5  # fp32, as released
    w.t[f"{m}.e_score_correction_bias"] = 0.01 * torch.randn(s["E"], generator=w.g)
    w.mlp(f"{m}.shared_experts", H, s["I"])
    for e in range(s["E"]):
        w.mlp(f"{m}.experts.{e}", H, s["I"], ("w1", "w3", "w2"))


def mxfp8_release(tensors: dict, qc: dict) -> tuple:
    """The MXFP8 release's layout of ModelOpt MXFP8 experts (lvllm.testing.checkpoint_quant): each expert projection's
    e8m0 scales under `weight_scale_inv` (vLLM's MiniMax-M3 loader renames them to ModelOpt's `weight_scale`) and
    MiniMax's own config tag, {"quant_method": "mxfp8", "ignored_layers": [...]} (vLLM's ModelOptMxFp8Config
    normalizes it to ModelOpt's schema); no hf_quant_config.json. -> (tensors, quantization_config, extra files)."""
    renamed = {(n[:-len("weight_scale")] + "weight_scale_inv" if n.endswith(".weight_scale") else n): t
               for n, t in tensors.items()}
    return renamed, {"quant_method": "mxfp8", "ignored_layers": qc["ignore"], "kv_cache_quant_algo": None}, {}
