"""lvllm.testing.eagle3_draft: the tiny EAGLE-3 draft's config and tensors in the release layout (vLLM reading them
is test_plugin_loads_checkpoints.py's test_eagle3_draft_loads_as_released_beside_the_hybrid_target)."""
import json
import os

import pytest
import torch
from safetensors.torch import load_file

from lvllm.testing.eagle3_draft import aux_layer_ids, draft_config, make_eagle3_draft
from lvllm.testing.tiny_checkpoint import make_checkpoint


def test_draft_follows_the_target_shape_and_maps_its_reduced_vocabulary(tmp_path):
    target = make_checkpoint("qwen3_moe", str(tmp_path / "t"))
    out = make_eagle3_draft(target, str(tmp_path / "d"))
    tcfg = json.load(open(os.path.join(target, "config.json")))
    cfg = json.load(open(os.path.join(out, "config.json")))
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["num_hidden_layers"] == 1
    assert cfg["hidden_size"] == tcfg["hidden_size"] and cfg["vocab_size"] == tcfg["vocab_size"]
    assert cfg["draft_vocab_size"] == tcfg["vocab_size"] // 2
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]  # 4 target layers: three distinct ones
    t = load_file(os.path.join(out, "model.safetensors"))
    H, V, Vd = cfg["hidden_size"], cfg["vocab_size"], cfg["draft_vocab_size"]
    assert t["fc.weight"].shape == (H, 3 * H) and t["lm_head.weight"].shape == (Vd, H)
    assert t["midlayer.self_attn.q_proj.weight"].shape[1] == 2 * H  # embedding and hidden state side by side
    assert not any("embed_tokens" in n for n in t)  # the target's embedding is shared
    # d2t: offsets from draft id to target id; t2d: the target ids the draft proposes, the same set
    targets = torch.arange(Vd) + t["d2t"]
    assert torch.equal(targets, t["t2d"].nonzero().flatten()) and int(t["t2d"].sum()) == Vd
    assert bool((targets[1:] > targets[:-1]).all()) and int(targets.max()) < V


def test_aux_layers_are_vllms_default_where_distinct():
    assert aux_layer_ids(48) == [2, 24, 45]  # vLLM's (2, L // 2, L - 3): Qwen3-30B-A3B's 48 layers
    assert aux_layer_ids(4) == [1, 2, 3] and aux_layer_ids(5) == [1, 2, 4]
    assert all(len(set(aux_layer_ids(n))) == 3 and max(aux_layer_ids(n)) <= n for n in range(4, 100))
    with pytest.raises(ValueError, match="three distinct"):
        aux_layer_ids(3)


def test_bad_targets_and_vocabularies_are_refused():
    with pytest.raises(ValueError, match="lacks"):
        draft_config({"hidden_size": 64}, 8)
    with pytest.raises(ValueError, match="draft_vocab"):
        draft_config({"hidden_size": 64, "num_attention_heads": 4, "vocab_size": 100, "num_hidden_layers": 8}, 101)
