"""DeepSeek-V4.1's generated config (lvllm.testing.deepseek_v41) as vLLM 0.33.0's own code reads it: its config
class, its Engram layout and tokenizer check, its attention topology's constraints (the model itself builds on
CUDA only: the H200's v41probe part starts it)."""
import json
from types import SimpleNamespace

import pytest

from lvllm.cli.checkpoint_info import engram_table_bytes, read_checkpoint
from lvllm.testing.deepseek_v41 import IMAGE_PLACEHOLDER, attention_topology
from lvllm.testing.tiny_checkpoint import make_checkpoint

pytest.importorskip("vllm")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def v41(tmp_path_factory):
    return make_checkpoint("deepseek_v41", str(tmp_path_factory.mktemp("v41") / "ckpt"), quant="mxfp4")


def test_vllm_config_class_flattens_it(v41):
    from vllm.transformers_utils.configs.deepseek_v41 import DeepseekV41Config

    with open(f"{v41}/config.json") as f:
        raw = json.load(f)
    cfg = DeepseekV41Config(**{k: v for k, v in raw.items() if k != "model_type"})
    text = raw["text_config"]
    assert raw["architectures"] == ["DeepseekV41ForCausalLM"]
    for key in ("hidden_size", "num_hidden_layers", "n_routed_experts", "swiglu_limit", "compress_ratios",
                "kv_source_layer_ids", "engram_layer_ids", "hc_sinkhorn_iters"):
        assert getattr(cfg, key) == text[key], key
    assert cfg.expert_dtype == "fp4"  # read from the quantization config, as the release carries it
    assert cfg.rope_parameters["rope_type"] == "default"


def test_engram_layout_and_tokenizer_as_vllm_checks_them(v41):
    from vllm.models.deepseek_v41.common.engram import EngramLayout, build_compressed_token_map

    with open(f"{v41}/config.json") as f:
        text = json.load(f)["text_config"]
    tok = transformers.AutoTokenizer.from_pretrained(v41)
    assert len(tok) == text["vocab_size"]
    assert tok.convert_tokens_to_ids(IMAGE_PLACEHOLDER[0]) == IMAGE_PLACEHOLDER[1] == text["image_token_id"]
    assert build_compressed_token_map(tok)[1] == text["engram_compressed_vocab_size"]

    layout = EngramLayout(SimpleNamespace(**text))
    rows = [sum(p for per_ngram in layer for p in per_ngram) for layer in layout.primes]
    assert rows == text["engram_num_embeddings"]  # each table exactly holds its bucket ranges
    assert engram_table_bytes(text) == sum(rows) * (text["engram_head_dim"] + text["engram_head_dim"] // 32)


@pytest.mark.parametrize("layers", [3, 4, 6, 10, 20, 43])
def test_topology_meets_vllm_constraints(layers):
    t = attention_topology(layers)
    ratios, sources = t["compress_ratios"], t["kv_source_layer_ids"]
    assert len(ratios) == layers and set(ratios) <= {0, 1, 2}
    for i, r in enumerate(ratios):  # a compressed layer reads the nearest source at or below it
        assert r == 0 or any(s <= i and ratios[s] == r for s in sources), (i, ratios, sources)
    # vLLM replays the layers past the last kv source on a sliding window: that source is not ratio 2
    assert ratios[max(sources)] <= 1
    assert t["index_source_layer_ids"] == sources


def test_checkpoint_info_reads_the_nested_config(v41):
    info = read_checkpoint(v41)
    assert info.architecture == "DeepseekV41ForCausalLM"
    assert info.quant_method == "fp8" and info.config["expert_dtype"] == "fp4"
    E, H, I = 16, 256, 128
    assert info.expert_bytes == int(4 * E * 3 * H * I * 17 / 32)  # MXFP4: 17 bytes per 32 weights
    assert info.host_table_bytes == engram_table_bytes(info.config) > 0


def test_dspark_stages_as_vllm_resolves_them(tmp_path):
    """mtp=3 on V4.1 writes DSpark stages (its speculative decoding): vLLM's own SpeculativeConfig resolves
    `{"method": "dspark", "num_speculative_tokens": 4}` to its V4.1 DSpark draft over the target's config (the stage
    count, the target layers it reads, the block and the noise token as written)."""
    from vllm.config import ModelConfig, ParallelConfig
    from vllm.config.speculative import SpeculativeConfig

    from lvllm.testing.deepseek_v41 import DSPARK_BLOCK

    path = make_checkpoint("deepseek_v41", str(tmp_path / "ds"), mtp=3)
    target = ModelConfig(model=path, dtype="bfloat16", max_model_len=512)
    spec = SpeculativeConfig(method="dspark", num_speculative_tokens=DSPARK_BLOCK, target_model_config=target,
                             target_parallel_config=ParallelConfig())
    draft = spec.draft_model_config.hf_config
    assert spec.use_dspark() and spec.num_speculative_tokens == DSPARK_BLOCK
    assert spec.draft_model_config.architectures == ["DSparkV41DraftModel"]
    layers = target.hf_config.num_hidden_layers
    assert draft.num_nextn_predict_layers == 3 and draft.dspark_target_layer_ids == [1, layers // 2, layers - 1]
    assert draft.dspark_block_size == DSPARK_BLOCK and draft.dspark_noise_token_id == target.hf_config.vocab_size - 1
