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
~189 GiB do not fit beside the experts on a 125 GiB host). Config only: no weights are written for V4.1
yet, serve it with --load-format dummy.
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
                 engram_layers=(1,), engram_vocab=1000, engram_heads=4, engram_dim=64, ngram=3, ctx=4096),
    "big": dict(H=4096, L=43, nh=64, hd=512, q_lora=1024, o_groups=8, o_lora=1024, E=256, K=6, I=2048,
                V=129280, idx_heads=64, idx_dim=128, idx_topk=512, hc=4, swiglu_limit=10.0, hash_layers=0,
                layer_types=None, engram_layers=(1, 12), engram_vocab=1_000_000, engram_heads=8, engram_dim=256, ngram=3,
                ctx=1048576),
}


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


def engram_fields(s: dict, n_layers: int, tokenizer_dir: str) -> dict:
    """engram_* of the text config; each layer's table holds exactly its prime-sized bucket ranges."""
    from vllm.models.deepseek_v41.common.engram import EngramLayout

    layers = [i for i in s["engram_layers"] if i < n_layers]
    fields = dict(engram_layer_ids=layers, engram_vocab_size=s["engram_vocab"], engram_n_heads=s["engram_heads"],
                  engram_head_dim=s["engram_dim"], engram_max_ngram_size=s["ngram"], engram_pad_token_id=0,
                  engram_compressed_vocab_size=compressed_vocab_size(tokenizer_dir))
    if not layers:
        return fields
    probe = EngramLayout(types.SimpleNamespace(**fields, engram_num_embeddings=[0] * len(layers)))
    fields["engram_num_embeddings"] = [sum(p for per_ngram in layer for p in per_ngram) for layer in probe.primes]
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
    return dict(architectures=["DeepseekV41ForCausalLM"], model_type="deepseek_v41", text_config=text,
                tie_word_embeddings=False, torch_dtype="bfloat16")
