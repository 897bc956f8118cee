"""DeepSeek-V4.1's config.json for lvllm.testing.tiny_checkpoint: the text model nested under text_config
(vLLM 0.33.0's DeepseekV41Config flattens it), DeepSeek-V4's MoE and mHC fields, V4.1's attention topology
and its Engram n-gram tables.

V4.1's attention: per layer a compress ratio (0 sliding window only, 1 a full-length compressed cache,
2 every second token); compressors and compressed caches live only on the kv-source layers, indexers only
on the index-source layers, and the other compressed layers read the nearest source below them. Engram:
on engram_layer_ids, n-gram hashes of the last tokens (over a "compressed" vocabulary: tokens that
normalize alike share an id) look up FP8 rows in tables that vLLM keeps in pinned host memory by default
(EngramConfig.cpu_offload), one prime-sized bucket range per (n-gram size, head).

The release's config is not public here: "big" is DeepSeek-V4-Flash's backbone (the V4.1 runner is ported
from V4's) with this topology, and the table sizes make the Engram tables ~8 GiB (the real checkpoint's
~189 GiB do not fit beside the experts on a 125 GiB host). Tiny: with weights (`weights`), in the release's names
as vLLM's V4.1 mapper reads them: V4's decoder block (lvllm.testing.deepseek_v4) without its learned hc_head, a
compressor on each kv-source layer (wkv, and wgate where the ratio is 2), an indexer on each index-source layer (wq_b,
weights_proj, wk on the compressed latent, k_norm), the Engram layers' FP8 tables with e8m0 scales per 32 values
(engram.embed.weight / .scale), their wkv and q / k weights, and a small vision tower with its aligner and image
markers. Big: config only, serve it with --load-format dummy.
"""
from __future__ import annotations

import types

# The release's image placeholder and its id: vLLM's V4.1 processor refuses a tokenizer that has it elsewhere, and
# its router and Engram key image positions off the id (a V4.1 vocabulary therefore has the release's size)
IMAGE_PLACEHOLDER = ("<｜deepseek_image｜>", 129264)

# tiny: CI-fast, the kernels' fixed widths (head_dim 512, 64 indexer heads of 128, a top-k FlashMLA tiles
# divide); big: DeepSeek-V4-Flash's backbone (transformers' DeepseekV4Config defaults). No hash-routed layers
# (vLLM's V4.1 MoE has none) and no V4 layer types (the topology below replaces them).
SHAPES = {
    "tiny": dict(H=256, L=4, nh=4, hd=512, q_lora=128, o_groups=2, o_lora=64, E=16, K=4, I=128, V=129280,
                 idx_heads=64, idx_dim=128, idx_topk=128, hc=4, swiglu_limit=10.0, hash_layers=0, layer_types=None,
                 engram_layers=(1,), engram_vocab=1000, engram_heads=4, engram_dim=64, ngram=3, ctx=4096,
                 vis_H=128, vis_heads=2, vis_I=256, vis_layers=1),
    "big": dict(H=4096, L=43, nh=64, hd=512, q_lora=1024, o_groups=8, o_lora=1024, E=256, K=6, I=2048,
                V=129280, idx_heads=64, idx_dim=128, idx_topk=512, hc=4, swiglu_limit=10.0, hash_layers=0,
                layer_types=None, engram_layers=(1, 12), engram_vocab=1_000_000, engram_heads=8, engram_dim=256, ngram=3,
                ctx=1048576),
}


VISION_PATCH = 14
VISION_MERGE = 3  # vLLM's default downsample_ratio: the aligner merges 3 x 3 patches


def attention_topology(n_layers: int) -> dict:
    """Layers 0-1 sliding window only; from layer 2 groups of four whose first layer is a kv and index
    source, ratio 2 and ratio 1 groups alternating (both kinds of compressed cache, sources and readers), the
    last group ratio 1 (vLLM replays the layers past the last kv source on a window: it must not be ratio 2)."""
    ratios, sources = [], []
    last_group = max(n_layers - 3, 0) // 4
    for i in range(n_layers):
        if i < 2:
            ratios.append(0)
            continue
        group = (i - 2) // 4
        ratios.append(1 if (last_group - group) % 2 == 0 else 2)
        if (i - 2) % 4 == 0:
            sources.append(i)
    return dict(compress_ratios=ratios, kv_source_layer_ids=sources, index_source_layer_ids=sources,
                candidate_source_layer_id=-1, candidate_topk_blocks=0, candidate_block_size=0)


def compressed_vocab_size(tokenizer_dir: str) -> int:
    """The size vLLM's Engram derives from the tokenizer at startup (it refuses a config that differs)."""
    from transformers import AutoTokenizer
    from vllm.models.deepseek_v41.common.engram import build_compressed_token_map

    return build_compressed_token_map(AutoTokenizer.from_pretrained(tokenizer_dir))[1]


def _engram_shape_fields(s: dict, n_layers: int) -> dict:
    return dict(engram_layer_ids=[i for i in s["engram_layers"] if i < n_layers], engram_vocab_size=s["engram_vocab"],
                engram_n_heads=s["engram_heads"], engram_head_dim=s["engram_dim"], engram_max_ngram_size=s["ngram"],
                engram_pad_token_id=0)


def engram_table_rows(s: dict, n_layers: int) -> dict:
    """Engram layer -> rows of its table: exactly its prime-sized bucket ranges, as vLLM's EngramLayout draws them
    (the compressed vocabulary plays no part in them)."""
    from vllm.models.deepseek_v41.common.engram import EngramLayout

    fields = _engram_shape_fields(s, n_layers)
    layers = fields["engram_layer_ids"]
    if not layers:
        return {}
    probe = EngramLayout(types.SimpleNamespace(**fields, engram_num_embeddings=[0] * len(layers),
                                               engram_compressed_vocab_size=0))
    return {i: sum(p for per_ngram in layer for p in per_ngram) for i, layer in zip(layers, probe.primes)}


def engram_fields(s: dict, n_layers: int, tokenizer_dir: str) -> dict:
    """engram_* of the text config."""
    fields = dict(_engram_shape_fields(s, n_layers), engram_compressed_vocab_size=compressed_vocab_size(tokenizer_dir))
    rows = engram_table_rows(s, n_layers)
    if rows:
        fields["engram_num_embeddings"] = list(rows.values())
    return fields


# DSpark, V4.1's speculative decoding (vLLM's DSparkV41DraftModel, `--speculative-config '{"method": "dspark",
# "num_speculative_tokens": 4}'`): its stages ship in the checkpoint under mtp.*, decoder layers numbered past the
# target's, fed the target's hidden states of dspark_target_layer_ids, drafting a block of tokens at once (the
# slots after the anchor hold the noise token). The release's values are not public here: vLLM's default of 3 stages,
# a block of 4, a Markov rank of 64 (tiny) / 256 (big), the first, middle and last layer's hidden states.
DSPARK_BLOCK = 4


def dspark_fields(s: dict, n_layers: int, vocab: int) -> dict:
    """The DSpark fields of the text config beside its stage count (num_nextn_predict_layers), read by vLLM's
    SpeculativeConfig and DSpark draft model."""
    targets = sorted({min(1, n_layers - 1), n_layers // 2, n_layers - 1})
    return dict(dspark_target_layer_ids=targets, dspark_block_size=DSPARK_BLOCK,
                dspark_markov_rank=64 if s["H"] <= 1024 else 256, dspark_noise_token_id=vocab - 1,
                enable_confidence_head=True)


def config(v4_text: dict, s: dict, tokenizer_dir: str) -> dict:
    """v4_text: DeepSeek-V4's config of the same shape (tiny_checkpoint's, no hash-routed layers): V4.1's text
    model keeps its fields and adds what vLLM's DeepseekV41Config has no default for, its attention topology, its
    Engram fields and the image placeholder's id."""
    L = s["L"]
    text = {k: v for k, v in v4_text.items() if k not in ("architectures", "model_type")}
    text.update(qk_rope_head_dim=64, hc_sinkhorn_iters=20, hc_eps=1e-6, rope_scaling={"rope_type": "default"},
                image_token_id=IMAGE_PLACEHOLDER[1])
    text.update(attention_topology(L))
    text.update(engram_fields(s, L, tokenizer_dir))
    cfg = dict(architectures=["DeepseekV41ForCausalLM"], model_type="deepseek_v41", text_config=text,
               tie_word_embeddings=False, torch_dtype="bfloat16")
    if "vis_H" in s:  # tiny: a small tower; big keeps vLLM's defaults (the release's tower is not public here)
        cfg["vision_config"] = dict(hidden_size=s["vis_H"], num_attention_heads=s["vis_heads"],
                                    intermediate_size=s["vis_I"], num_hidden_layers=s["vis_layers"],
                                    patch_size=VISION_PATCH)
    return cfg



def weights(s: dict, vocab: int, w) -> None:
    """The tiny model's tensors into `w` (tiny_checkpoint's _Weights), in the release's names (module docstring)."""
    import torch

    from . import deepseek_v4

    H, hd, L = s["H"], s["hd"], s["L"]
    topology, tables = attention_topology(L), engram_table_rows(s, L)
    deepseek_v4.embedding_and_head(s, vocab, w)  # V4.1 has no learned hc_head
    for i in range(L):
        p = f"layers.{i}"
        deepseek_v4.attention_block(s, w, p)
        a = f"{p}.attn"
        if i in topology["kv_source_layer_ids"]:  # the compressed cache's writer; ratio 1 pools nothing: no gate
            w.linear(f"{a}.compressor.wkv", hd, H)
            if topology["compress_ratios"][i] > 1:
                w.linear(f"{a}.compressor.wgate", hd, H)
            w.norm(f"{a}.compressor.norm", hd)
        if i in topology["index_source_layer_ids"]:
            w.linear(f"{a}.indexer.wq_b", s["idx_heads"] * s["idx_dim"], s["q_lora"])
            w.linear(f"{a}.indexer.weights_proj", s["idx_heads"], H)
            w.linear(f"{a}.indexer.wk", s["idx_dim"], hd)
            w.norm(f"{a}.indexer.k_norm", s["idx_dim"])
        if i in tables:
            _engram(s, w, f"{p}.engram", tables[i])
        _moe(s, w, p, vocab)
    _vision(s, w)
    for marker in ("image_start", "image_end", "image_newline"):
        w.t[marker] = torch.randn(H, generator=w.g)


def _moe(s: dict, w, p: str, vocab: int) -> None:
    """V4's MoE (no hash-routed layers in V4.1) and, beside a vision tower, the router's score bias for image tokens
    (fp32 gate.bias_vl)."""
    import torch

    from . import deepseek_v4

    deepseek_v4.moe(s, w, p, vocab, hashed=False)
    if s["vis_layers"]:
        w.t[f"{p}.ffn.gate.bias_vl"] = 0.01 * torch.randn(s["E"], generator=w.g)


def _engram(s: dict, w, e: str, rows: int) -> None:
    """One Engram layer: its table's rows N(0, 1) in FP8 with an e8m0 scale per 32 values (MXFP8, as vLLM's lookup
    reads them), wkv from the looked-up rows to a key per hc copy and a shared value, unit q / k gate weights."""
    import torch

    from .quantizers import quantize_mxfp8

    H, hc = s["H"], s["hc"]
    codes, scales = quantize_mxfp8(torch.randn(rows, s["engram_dim"], generator=w.g))
    w.t[f"{e}.embed.weight"] = codes
    w.t[f"{e}.embed.scale"] = scales.view(torch.float8_e8m0fnu)
    w.linear(f"{e}.wkv", H * (hc + 1), (s["ngram"] - 1) * s["engram_heads"] * s["engram_dim"])
    for name in ("q_weight", "k_weight"):
        w.t[f"{e}.{name}"] = torch.ones(hc, H, dtype=torch.bfloat16)


def _vision(s: dict, w) -> None:
    """The ViT (patch embedding, pre-norm blocks with fused qkv and a gated MLP, final norm) and the aligner that
    merges VISION_MERGE x VISION_MERGE patches into the text model's width."""
    Hv, I = s["vis_H"], s["vis_I"]
    w.linear("vision.patch_embed.proj", Hv, 3 * VISION_PATCH ** 2, bias=True)
    for b in range(s["vis_layers"]):
        q = f"vision.blocks.{b}"
        w.norm(f"{q}.norm1", Hv)
        w.norm(f"{q}.norm2", Hv)
        w.linear(f"{q}.attn.wqkv", 3 * Hv, Hv, bias=True)
        w.linear(f"{q}.attn.wo", Hv, Hv, bias=True)
        w.linear(f"{q}.mlp.w1", 2 * I, Hv)  # gate rows, then up rows
        w.linear(f"{q}.mlp.w2", Hv, I)
    w.norm("vision.norm", Hv)
    w.linear("aligner.w1", s["H"], Hv * VISION_MERGE ** 2, bias=True)
    w.linear("aligner.w2", s["H"], s["H"], bias=True)


def release_quant_as_v41(config: dict) -> None:
    """DeepSeek-V4's release quantization config (lvllm.testing.deepseek_v4) as V4.1's: the expert dtype inside the
    quantization config, and its ignored_layers (release names; tiny checkpoints only) as vLLM's V4.1 names its
    modules: its multimodal class keeps its weight mapper on the instance, so vLLM matches ignored_layers against
    module names unmapped and exactly (language_model.model.layers.<i>..., shared_experts.gate_up_proj / down_proj)."""
    qc = config["quantization_config"]
    qc["expert_dtype"] = config.pop("expert_dtype")
    if "ignored_layers" not in qc:
        return
    names = []
    for n in qc["ignored_layers"]:
        n = n.replace(".shared_experts.w2", ".shared_experts.down_proj")
        names.append("language_model.model." + n if n.startswith("layers.") else n)
        if n.endswith(".shared_experts.w1"):
            names.append(names[-1][:-len("w1")] + "gate_up_proj")
    qc["ignored_layers"] = names


def mtp_weights(s: dict, w, stages: int, tensors: dict) -> None:
    """DSpark stages as vLLM's V4.1 DSpark draft loads them (mtp.<i>.*; the target's embedding and head are shared):
    per stage V4's decoder block (sliding-window attention, a MoE like the target's), the context combiner on stage 0
    (main_proj over the dspark_target_layer_ids' hidden states, main_norm), and on the last stage the final norm, the
    Markov head's low-rank factors (embed: previous token -> rank, head: rank -> vocabulary) and the confidence head
    (fp32)."""
    import torch

    from . import deepseek_v4

    H, vocab = s["H"], tensors["embed.weight"].shape[0]
    fields = dspark_fields(s, s["L"], vocab)
    for i in range(stages):
        deepseek_v4.attention_block(s, w, f"mtp.{i}")
        _moe(s, w, f"mtp.{i}", vocab)
    w.linear("mtp.0.main_proj", H, H * len(fields["dspark_target_layer_ids"]))
    w.norm("mtp.0.main_norm", H)
    last, rank = f"mtp.{stages - 1}", fields["dspark_markov_rank"]
    w.norm(f"{last}.norm", H)
    w.t[f"{last}.markov_head.embed.weight"] = torch.randn(vocab, rank, generator=w.g).to(torch.bfloat16)
    w.linear(f"{last}.markov_head.head", vocab, rank)
    w.t[f"{last}.confidence_head.proj.weight"] = torch.randn(1, H + rank, generator=w.g) / (H + rank) ** 0.5
