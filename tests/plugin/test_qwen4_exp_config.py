"""Qwen3.8-Flash-Next's generated config (lvllm.testing.qwen4_exp, vLLM 0.33.0's Qwen4ExpForCausalLM) as transformers'
own class reads it, as vLLM decides where its PLE tables live, and as lvllm's readers (doctor, auto-fit) count it:
a MoE in every layer, the PLE tables in host RAM beside the experts. (Its model through vLLM's own construction and
dummy loader with the switch on: tests/plugin/test_plugin_loads_checkpoints.py.)"""
import json

import pytest

from lvllm.autofit_inputs import describe_model
from lvllm.cli.checkpoint_info import expert_shape, experts_per_token, ple_table_bytes, read_checkpoint
from lvllm.testing.qwen4_exp import SHAPES
from lvllm.testing.tiny_checkpoint import make_checkpoint

pytest.importorskip("vllm")
transformers = pytest.importorskip("transformers")

GiB = 1 << 30


@pytest.fixture(scope="module", params=["tiny", "big"])
def ckpt(request, tmp_path_factory):
    path = make_checkpoint("qwen4_exp", str(tmp_path_factory.mktemp("q4") / request.param), size=request.param)
    with open(f"{path}/config.json") as f:
        return request.param, SHAPES[request.param], path, json.load(f)


def test_transformers_class_reads_it(ckpt):
    size, s, _, raw = ckpt
    from transformers import Qwen4ExpTextConfig
    cfg = Qwen4ExpTextConfig(**{k: v for k, v in raw.items() if k not in ("model_type", "architectures")})
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size) == (s["E"], s["K"], s["I"])
    assert cfg.layer_types[:3] == ["linear_attention"] * 3 and cfg.layer_types[3] != "linear_attention"
    assert raw["layer_types"][3] == "full_attention"  # what transformers 5.17 (the GPU machine's) and 5.20 both read
    assert cfg.output_gate_type == "silu" and isinstance(cfg.eos_token_id, int)  # vLLM's GDN and PLE need both
    assert cfg.hidden_act == "silu" and cfg.ple_layer_ids == [1]


def test_indexer_block_budget_is_one_vllm_topk_kernel_takes(ckpt):
    """vLLM's QSA indexer selects budget / compress-ratio blocks a token with its cooperative top-k on Hopper for up to
    64 rows, which takes k = 512, 1024 or 2048 only (H200 2026-12-05: the tiny budget of 256 stopped stock vLLM and the
    switch-on run alike at startup, "cooperative_topk supports k=512, k=1024, or k=2048, got k=64")."""
    _, _, _, raw = ckpt
    assert raw["indexer_budget"] // raw["indexer_compress_ratio"] in (512, 1024, 2048), raw["indexer_budget"]


def test_vllm_keeps_the_ple_tables_in_host_ram_by_default(ckpt):
    """vLLM 0.33 creates an EngramConfig for every model with PLE layers, and its default keeps the tables in pinned
    host memory (`--engram-config '{"cpu_offload": false}'` moves them to VRAM): nothing for lvllm to move."""
    from vllm.config import EngramConfig, ModelConfig
    from vllm.config.engram import model_has_engram_layers
    size, _, path, _ = ckpt
    mc = ModelConfig(model=path, dtype="bfloat16", max_model_len=512)
    assert mc.architecture == "Qwen4ExpForCausalLM" and model_has_engram_layers(mc)
    assert EngramConfig().cpu_offload is True


def test_readers_count_every_layer_and_the_ple_tables(ckpt):
    size, s, path, raw = ckpt
    info = read_checkpoint(path)
    assert info.architecture == "Qwen4ExpForCausalLM" and info.moe_layers == s["L"]  # a MoE in every layer
    assert expert_shape(info.config) == (s["E"], s["H"], s["I"]) and experts_per_token(info.config) == s["K"]
    assert info.expert_bytes == s["L"] * s["E"] * 3 * s["H"] * s["I"] * 2  # bf16
    estimate = ple_table_bytes(raw)  # from the config: ngram_vocab_size_base rows of ple_embed_dim
    assert estimate == int(s["ple_base"] * s["H"] * (1 if size == "big" else 2))
    if size == "big":  # config only: the estimate; one FP8 PLE table of the release's width, ~48 GiB in host RAM
        assert info.host_table_bytes == estimate and 47 * GiB < info.host_table_bytes < 48 * GiB
    else:  # the tiny checkpoint's n-gram tables as written (their prime-sized heads, padded to 128 rows a shard)
        tables = 4 * 4224 * (s["H"] // 16) * 2  # 4 shards of 4224 rows x 16 columns, bf16
        assert info.host_table_bytes == tables and 1.0 <= tables / estimate < 1.1
    model = describe_model(info, tp=1, max_model_len=4096)
    assert model.top_k == s["K"] and model.host_table_bytes == info.host_table_bytes and model.fmt == "bf16"


def test_fewer_ple_rows_shrink_only_the_tables(tmp_path):
    """The decode benchmark's Qwen3.8 (`benchmarks/e2e_decode.py --arch qwen4_exp --ple-rows N`): the release's widths
    with an n-gram vocabulary base of N rows, so the FP8 table's dummy fill fits a 125 GiB host; everything else as
    written without it. An architecture without PLE tables refuses the override."""
    full = make_checkpoint("qwen4_exp", str(tmp_path / "full"), size="big", layers=4)
    small = make_checkpoint("qwen4_exp", str(tmp_path / "small"), size="big", layers=4, ple_rows=2_000_000)
    raw_full, raw_small = (json.load(open(f"{p}/config.json")) for p in (full, small))
    assert raw_small.pop("ngram_vocab_size_base") == 2_000_000
    assert raw_full.pop("ngram_vocab_size_base") == SHAPES["big"]["ple_base"]
    assert raw_small == raw_full
    info = read_checkpoint(small)
    assert info.host_table_bytes == 2_000_000 * SHAPES["big"]["H"]  # one FP8 byte a weight: ~4.8 GiB
    assert info.expert_bytes == read_checkpoint(full).expert_bytes
    with pytest.raises(ValueError, match="no per-layer embedding"):
        make_checkpoint("qwen3_next", str(tmp_path / "q3n"), size="big", layers=2, ple_rows=1000)
